"""Kernel microbenchmarks on one CUDA GPU, with the baselines measured in the same run.

- decode paged attention: achieved bandwidth (K/V bytes read) vs a device-to-device copy;
- prefill attention: Triton over the paged cache vs torch SDPA (flash) on contiguous data;
- RMSNorm (+ fused residual), RoPE, SiLU-and-mul: achieved bandwidth vs the copy;
- correctness of every kernel against its torch reference in bf16 and fp16 (`--no-check`
  skips it), and optionally a sweep of attention tile configs (`--sweep`).

Writes JSON (device, torch/triton versions, git commit, command, figures) to
benchmarks/results/, rewritten after every row, so a run cut short keeps what it measured.
Usage: `python benchmarks/bench_kernels.py [--quick] [--sweep]`. `TRITON_INTERPRET=1 ...
--smoke`: the same script at tiny sizes on the CPU, every timing from a fake clock (the GPU
battery's CPU test; its figures mean nothing).
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
DEVICE = "cuda"  # --smoke on the CPU sets "cpu" (under TRITON_INTERPRET=1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (num_heads, num_kv_heads, head_dim) of real models.
MODELS = {"llama-3.2-1b": (32, 8, 64), "qwen3-0.6b": (16, 8, 128), "llama-3.1-8b": (32, 8, 128)}
DECODE_SHAPES = [(1, 32768), (1, 8192), (4, 8192), (16, 4096), (64, 2048), (256, 1024)]
PREFILL_SHAPES = [(1, 8192), (4, 2048), (16, 512)]
ELEMENTWISE_SHAPE = (8192, 4096, 14336)  # tokens, hidden, intermediate (Llama-3.1-8B)
QUICK_DECODE, QUICK_PREFILL = [(1, 8192), (64, 2048)], [(4, 2048)]
SMOKE_DECODE, SMOKE_PREFILL, SMOKE_ELEMENTWISE = [(1, 40), (2, 24)], [(1, 24)], (8, 256, 512)
FAKE_MS = 1.0  # --smoke: what every timing reads (the fake clock)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--block-size", type=int, choices=(16, 32), default=16)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--sweep", action="store_true", help="also time other attention tiles")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the correctness check against the torch references")
    parser.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/...)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU under TRITON_INTERPRET=1, timings from a fake clock")
    return parser.parse_args(argv)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def time_ms(fn: Callable[[], object], repeats: int = 7) -> float:
    """Median per-call GPU time of `fn` replayed from a CUDA graph, so that Python and launch
    overhead do not hide microsecond kernels; each repeat covers ~20 ms of replays. Off the
    GPU (--smoke): `fn` runs once and the fake clock says FAKE_MS."""
    fn()  # compiles Triton kernels outside the capture
    if DEVICE != "cuda":
        return FAKE_MS
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    iters = max(3, min(2000, int(20.0 / max(start.elapsed_time(end), 1e-3))))
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    if DEVICE != "cuda":
        nbytes = 1 << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).random_()
    dst = torch.empty_like(src)
    return 2 * nbytes / time_ms(lambda: dst.copy_(src)) / 1e6


def paged_inputs(batch: int, query_len: int, context: int, model: str, dtype, block_size: int):
    """Random cache with shuffled physical blocks, packed q, and the batch metadata."""
    num_heads, num_kv_heads, head_dim = MODELS[model]
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + 1
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, dtype=dtype, device=DEVICE)
    v_cache = torch.randn(cache_shape, dtype=dtype, device=DEVICE)
    tables = (torch.randperm(num_blocks - 1, device=DEVICE) + 1).int()
    tables = tables[: batch * blocks_per_seq].view(batch, blocks_per_seq)
    q = torch.randn(batch * query_len, num_heads, head_dim, dtype=dtype, device=DEVICE)
    starts = torch.arange(0, batch + 1, dtype=torch.int32, device=DEVICE) * query_len
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    return (q, k_cache, v_cache, tables, starts, seq_lens, head_dim**-0.5, query_len, context)


def bench_decode(args, copy_gbps: float, configs, rows: list[dict], save: Callable[[], None]) -> None:
    from kvdeck.kernels.triton.attention import paged_attention_triton_impl

    shapes = SMOKE_DECODE if args.smoke else QUICK_DECODE if args.quick else DECODE_SHAPES
    for model in args.models:
        for batch, context in shapes:
            inputs = paged_inputs(batch, 1, context, model, DTYPES[args.dtype], args.block_size)
            q, k_cache = inputs[0], inputs[1]
            kv_bytes = 2 * batch * context * k_cache[0, 0].numel() * k_cache.element_size()
            nbytes = kv_bytes + 2 * q.numel() * q.element_size()
            for name, config in configs:
                ms = time_ms(lambda c=config, a=inputs: paged_attention_triton_impl(*a, config=c))
                gbps = nbytes / ms / 1e6
                rows.append({"model": model, "batch": batch, "context": context, "config": name,
                             "ms": round(ms, 4), "gbps": round(gbps, 1),
                             "fraction_of_copy": round(gbps / copy_gbps, 3)})
                save()
                print(f"decode  {model:14s} b={batch:<4d} ctx={context:<6d} {name:8s} "
                      f"{ms:8.4f} ms {gbps:7.1f} GB/s {gbps / copy_gbps:6.1%} of copy", flush=True)
            del inputs, q, k_cache


def sdpa_flash(q, k, v) -> Callable[[], torch.Tensor]:
    """Causal SDPA restricted to the flash backend (GQA through enable_gqa when available)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]

    def run() -> torch.Tensor:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=group > 1)

    return run


def bench_prefill(args, configs, rows: list[dict], save: Callable[[], None]) -> None:
    from kvdeck.kernels.triton.attention import paged_attention_triton_impl

    shapes = SMOKE_PREFILL if args.smoke else QUICK_PREFILL if args.quick else PREFILL_SHAPES
    for model in args.models:
        num_heads, num_kv_heads, head_dim = MODELS[model]
        for batch, length in shapes:
            inputs = paged_inputs(batch, length, length, model, DTYPES[args.dtype],
                                  args.block_size)
            q = inputs[0]
            flops = 4 * batch * num_heads * head_dim * length * (length + 1) / 2  # causal
            # The same data laid out contiguously for SDPA: [batch, heads, length, head_dim].
            q_dense = q.view(batch, length, num_heads, head_dim).transpose(1, 2).contiguous()
            kv_dense = torch.randn(2, batch, num_kv_heads, length, head_dim, dtype=q.dtype,
                                   device=DEVICE)
            try:
                if DEVICE != "cuda":
                    raise RuntimeError("no flash attention off the GPU")
                sdpa_ms = time_ms(sdpa_flash(q_dense, kv_dense[0], kv_dense[1]))
            except (RuntimeError, TypeError) as exc:  # no flash for this shape/build
                sdpa_ms, sdpa_error = None, str(exc).splitlines()[0]
            else:
                sdpa_error = None
            for name, config in configs:
                ms = time_ms(lambda c=config, a=inputs: paged_attention_triton_impl(*a, config=c))
                row = {"model": model, "batch": batch, "length": length, "config": name,
                       "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1),
                       "sdpa_flash_ms": None if sdpa_ms is None else round(sdpa_ms, 4),
                       "fraction_of_sdpa": None if sdpa_ms is None else round(sdpa_ms / ms, 3)}
                if sdpa_error:
                    row["sdpa_error"] = sdpa_error
                rows.append(row)
                save()
                ratio = "n/a" if sdpa_ms is None else f"{sdpa_ms / ms:6.1%}"
                print(f"prefill {model:14s} b={batch:<4d} len={length:<6d} {name:8s} "
                      f"{ms:8.4f} ms {flops / ms / 1e9:6.1f} TFLOP/s  {ratio} of SDPA flash", flush=True)
            del inputs, q, q_dense, kv_dense


def bench_elementwise(args, copy_gbps: float, rows: list[dict], save: Callable[[], None]) -> None:
    from kvdeck.kernels.dispatch import TORCH_OPS
    from kvdeck.kernels.reference.rope import build_cos_sin_cache
    from kvdeck.kernels.triton import ops as triton_ops

    ops = triton_ops.TRITON_OPS
    dtype = DTYPES[args.dtype]
    elem = torch.finfo(dtype).bits // 8
    tokens, hidden, inter = SMOKE_ELEMENTWISE if args.smoke else ELEMENTWISE_SHAPE
    x = torch.randn(tokens, hidden, dtype=dtype, device=DEVICE)
    residual = torch.randn_like(x)
    weight = torch.rand(hidden, dtype=dtype, device=DEVICE)
    qk = torch.randn(tokens, 40, 128, dtype=dtype, device=DEVICE)  # 32 q heads + 8 kv heads
    positions = torch.randint(0, 8192, (tokens,), device=DEVICE)
    cos_sin = build_cos_sin_cache(1.0 / 500000 ** (torch.arange(0, 128, 2) / 128), 8192).to(DEVICE)
    gate_up = torch.randn(tokens, 2 * inter, dtype=dtype, device=DEVICE)
    cases = [
        ("rms_norm", lambda o: o.rms_norm(x, weight, 1e-6), 2 * x.numel() * elem),
        ("rms_norm+residual", lambda o: o.rms_norm(x, weight, 1e-6, residual),
         4 * x.numel() * elem),
        ("rope_neox", lambda o: o.apply_rope(positions, qk[:, :32], qk[:, 32:], cos_sin, True),
         2 * qk.numel() * elem + tokens * cos_sin.shape[1] * 4),
        ("silu_and_mul", lambda o: o.silu_and_mul(gate_up), 3 * tokens * inter * elem),
    ]
    for name, call, nbytes in cases:
        triton_ms = time_ms(lambda c=call: c(ops))
        torch_ms = time_ms(lambda c=call: c(TORCH_OPS))
        gbps = nbytes / triton_ms / 1e6
        rows.append({"op": name, "tokens": tokens, "ms": round(triton_ms, 4),
                     "gbps": round(gbps, 1), "fraction_of_copy": round(gbps / copy_gbps, 3),
                     "torch_eager_ms": round(torch_ms, 4)})
        save()
        print(f"{name:18s} {triton_ms:8.4f} ms {gbps:7.1f} GB/s {gbps / copy_gbps:6.1%} of "
              f"copy (torch eager {torch_ms:.4f} ms)", flush=True)


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def write_json_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    global DEVICE
    args = parse_args(argv)
    if args.smoke:
        if not torch.cuda.is_available() and not interpreted():
            print("bench_kernels: --smoke on the CPU needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        DEVICE = "cuda" if torch.cuda.is_available() and not interpreted() else "cpu"
        args.models = args.models[:1]
    elif interpreted():
        print("bench_kernels: unset TRITON_INTERPRET; interpreter timings mean nothing",
              file=sys.stderr)
        return 2
    elif not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO_ROOT))
    import check_kernels_gpu  # beside this script
    import triton

    from kvdeck.kernels.triton import attention_tuning as at

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = device_name()
    print(f"{device}  torch {torch.__version__}  triton {triton.__version__}")
    copy_gbps = copy_bandwidth_gbps()
    print(f"device-to-device copy: {copy_gbps:.1f} GB/s")
    decode_configs = [("default", None)]
    prefill_configs = [("default", None)]
    if args.sweep:
        decode_configs += [(f"m{c.block_m}n{c.tile_n}w{c.num_warps}s{c.num_stages}", c) for c in (
            at.AttentionConfig(16, 64, 4, 3), at.AttentionConfig(16, 64, 8, 3),
            at.AttentionConfig(16, 128, 4, 2), at.AttentionConfig(16, 32, 4, 4))]
        prefill_configs += [(f"m{c.block_m}n{c.tile_n}w{c.num_warps}s{c.num_stages}", c) for c in (
            at.AttentionConfig(128, 64, 8, 2), at.AttentionConfig(128, 32, 8, 3),
            at.AttentionConfig(64, 64, 4, 3), at.AttentionConfig(64, 32, 4, 3))]
    payload = {
        "benchmark": "kernels",
        "device": device,
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "timestamp_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dtype": args.dtype,
        "block_size": args.block_size,
        "timing": ("median of CUDA-graph replays (7 repeats of ~20 ms)" if DEVICE == "cuda"
                   else f"fake clock (--smoke: every timing {FAKE_MS} ms)"),
        "copy_bandwidth_gbps": round(copy_gbps, 1),
        "decode_attention": [], "prefill_attention": [], "elementwise": [],
    }
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = args.out or RESULTS_DIR / f"kernels-{slug}-{args.dtype}-{stamp}.json"

    def save() -> None:
        write_json_atomic(out, payload)

    save()
    if args.check:
        payload["correctness"] = check_kernels_gpu.check_all(args.smoke, lambda rows: save())
    bench_decode(args, copy_gbps, decode_configs, payload["decode_attention"], save)
    bench_prefill(args, prefill_configs, payload["prefill_attention"], save)
    bench_elementwise(args, copy_gbps, payload["elementwise"], save)
    payload["complete"] = True
    save()
    print(f"wrote {out}")
    failed = [row for row in payload.get("correctness", []) if not row["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
