"""Every Triton kernel against its torch reference on the GPU, in bf16 and fp16.

Run by `bench_kernels.py` (results go into its JSON) or alone:
`python benchmarks/check_kernels_gpu.py [--out FILE]` (exit 1 on any mismatch, 2 without
CUDA; the JSON is rewritten after every check, so a run cut short keeps what it checked).
`TRITON_INTERPRET=1 ... --smoke`: the same checks at tiny sizes on the CPU (the battery's
CPU test).
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels  # noqa: E402  (beside this script)

# (query lengths, context lengths) of the mixed batch, the decode context, the elementwise
# rows: the real check's, and the smoke form's (the interpreter runs each program in Python).
FULL = ([1, 37, 1, 300, 5], [700, 37, 129, 650, 16], 3000, 64, list(bench_kernels.MODELS))
SMOKE = ([1, 3, 1, 6, 2], [20, 3, 9, 17, 2], 40, 4, ["qwen3-0.6b"])


def check_all(smoke: bool = False, on_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every kernel vs its torch reference on this GPU, bf16 and fp16; `on_row(rows)` after
    each check."""
    from kvdeck.kernels.dispatch import TORCH_OPS
    from kvdeck.kernels.reference.attention import paged_attention_torch
    from kvdeck.kernels.reference.int8_gemm import int8_head_torch, quantize_int8_blocks
    from kvdeck.kernels.triton.attention import paged_attention_triton_impl
    from kvdeck.kernels.triton.int8_head import int8_head_triton
    from kvdeck.kernels.triton.ops import TRITON_OPS

    device = bench_kernels.DEVICE
    rows = []

    def record(name: str, dtype_name: str, got: torch.Tensor, want: torch.Tensor, tol: float):
        # |got - want| / (1 + |want|): absolute near zero, relative for large outputs.
        want = want.float()
        err = ((got.float() - want).abs() / (1 + want.abs())).max().item()
        rows.append({"case": name, "dtype": dtype_name, "max_err": err, "ok": err <= tol})
        print(f"check {name:36s} {dtype_name} err={err:.2e} {'ok' if err <= tol else 'FAIL'}", flush=True)
        if on_row is not None:
            on_row(rows)

    query_lens, context_lens, decode_context, elementwise_rows, models = SMOKE if smoke else FULL
    for dtype_name, dtype in bench_kernels.DTYPES.items():
        tol = 2e-2 if dtype == torch.bfloat16 else 3e-3  # a few ulp of the output dtype
        for model in models:
            for block_size in (16, 32):
                # Mixed batch: decode rows and prefill/extend chunks of ragged lengths.
                inputs = list(bench_kernels.paged_inputs(5, 1, max(context_lens), model, dtype, block_size))
                q_lens = torch.tensor(query_lens, device=device, dtype=torch.int32)
                inputs[4] = torch.cat([q_lens.new_zeros(1), q_lens.cumsum(0)]).int()
                inputs[5] = torch.tensor(context_lens, device=device).int()
                inputs[0] = torch.randn(int(q_lens.sum()), *inputs[0].shape[1:], dtype=dtype,
                                        device=device)
                inputs[7] = max(query_lens)
                want = paged_attention_torch(*[t.float() if i < 3 else t
                                               for i, t in enumerate(inputs)])
                got = paged_attention_triton_impl(*inputs)
                record(f"attention_mixed_{model}_bs{block_size}", dtype_name, got, want, tol)
            decode = bench_kernels.paged_inputs(2, 1, decode_context, model, dtype, 16)
            want = paged_attention_torch(*[t.float() if i < 3 else t
                                           for i, t in enumerate(decode)])
            for segments in (1, 4, 16):
                got = paged_attention_triton_impl(*decode, num_segments=segments)
                record(f"attention_decode_{model}_split{segments}", dtype_name, got, want, tol)
        x = torch.randn(elementwise_rows, 4096, dtype=dtype, device=device)
        r, w = torch.randn_like(x), torch.rand(4096, dtype=dtype, device=device)
        record("rms_norm", dtype_name, TRITON_OPS.rms_norm(x, w, 1e-6),
               TORCH_OPS.rms_norm(x, w, 1e-6), tol)
        got, want = TRITON_OPS.rms_norm(x, w, 1e-6, r), TORCH_OPS.rms_norm(x, w, 1e-6, r)
        record("rms_norm_residual", dtype_name, torch.cat(got), torch.cat(want), tol)
        record("silu_and_mul", dtype_name, TRITON_OPS.silu_and_mul(x), TORCH_OPS.silu_and_mul(x),
               tol)
        record("gelu_tanh_and_mul", dtype_name, TRITON_OPS.gelu_tanh_and_mul(x),
               TORCH_OPS.gelu_tanh_and_mul(x), tol)
        from kvdeck.kernels.reference.rope import build_cos_sin_cache

        cache = build_cos_sin_cache(1.0 / 10000 ** (torch.arange(0, 64, 2) / 64), 4096).to(device)
        positions = torch.randint(0, 4096, (elementwise_rows,), device=device)
        for neox in (True, False):
            q = torch.randn(elementwise_rows, 8, 128, dtype=dtype, device=device)
            k = torch.randn(elementwise_rows, 2, 128, dtype=dtype, device=device)
            want = TORCH_OPS.apply_rope(positions, q, k, cache, neox)
            got = TRITON_OPS.apply_rope(positions, q.clone(), k.clone(), cache, neox)
            record(f"rope_partial_{'neox' if neox else 'interleaved'}", dtype_name,
                   torch.cat([got[0], got[1]], 1), torch.cat([want[0], want[1]], 1), tol)
        key = torch.randn(50, 2, 128, dtype=dtype, device=device)
        caches = [torch.zeros(8, 16, 2, 128, dtype=dtype, device=device) for _ in range(4)]
        slots = torch.randperm(128, device=device)[:50]
        slots[::7] = -1
        TRITON_OPS.write_kv_cache(key, key, caches[0], caches[1], slots)
        TORCH_OPS.write_kv_cache(key, key, caches[2], caches[3], slots)
        record("write_kv_cache", dtype_name, torch.cat(caches[:2]), torch.cat(caches[2:]), 0.0)
        # An INT4 model's output head in int8 (kernels/triton/int8_head.py): decode's rows and
        # a larger step, a vocabulary that is not whole tiles.
        vocab, hidden = (200, 64) if smoke else (4001, 2048)
        q, scales = quantize_int8_blocks(torch.randn(vocab, hidden, device=device) * 0.02)
        for m in (1, 20):
            x = torch.randn(m, hidden, dtype=dtype, device=device)
            record(f"int8_head_m{m}", dtype_name, int8_head_triton(x, q, scales),
                   int8_head_torch(x, q, scales), tol)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU, under TRITON_INTERPRET=1 (no GPU)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here, as the checks go")
    args = parser.parse_args(argv)
    if args.smoke:
        if not torch.cuda.is_available() and not bench_kernels.interpreted():
            parser.error("--smoke on the CPU needs TRITON_INTERPRET=1")
        bench_kernels.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    elif not torch.cuda.is_available():
        print("check_kernels_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    payload = {"benchmark": "check_kernels", "device": bench_kernels.device_name(),
               "git_commit": bench_kernels.git_commit(), "smoke": args.smoke, "checks": []}

    def write(rows: list[dict]) -> None:
        if args.out is not None:
            payload["checks"] = rows
            bench_kernels.write_json_atomic(args.out, payload)

    rows = check_all(args.smoke, write)
    failed = [row for row in rows if not row["ok"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} checks passed")
    if args.out is not None:
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
