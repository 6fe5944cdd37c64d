"""The CPU INT4 kernel (kernels/cpu/int4.py, with the int8 output head of kernels/cpu/int8.py)
against the paths it replaces, over a whole model's projections as one step reads them:
dequantise-then-matmul (the INT4 path before it: AutoAWQ's tensors dequantised to bf16 every
call, then oneDNN's bf16 matmul) and the bf16 model itself (oneDNN's packed weights, and the
bf16 GEMV kernel up to four rows).

For each row count a "step" runs every projection once (per layer: the merged qkv, o, the
merged gate_up, down; then the output head), each variant on its own copy of the weights so
that they stream from memory as in a real step. Variants alternate within each round; the
ratios are per round. The machine's load average is recorded before and after.

    python benchmarks/bench_cpu_int4.py --out benchmarks/results/cpu_int4_smollm2.json
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (layers, hidden, intermediate, q heads, kv heads, head dim, vocab): SmolLM2-135M
MODELS = {"smollm2": (30, 576, 1536, 9, 3, 64, 49152), "demo": (6, 256, 768, 4, 2, 64, 4096)}
GROUP = 64  # kvdeck quantize's default for SmolLM2's widths


def projection_shapes(model: str) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    layers, hidden, inter, heads, kv_heads, head_dim, vocab = MODELS[model]
    per_layer = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
                 (2 * inter, hidden), (hidden, inter)]
    return per_layer * layers, (vocab, hidden)


def random_awq(n: int, k: int, generator: torch.Generator):
    from kvdeck.quant.packing import pack_int4

    q = torch.randint(0, 16, (k, n), generator=generator, dtype=torch.int32)
    zeros = torch.randint(0, 16, (k // GROUP, n), generator=generator, dtype=torch.int32)
    scales = (torch.rand(k // GROUP, n, generator=generator) * 0.02 + 0.001).half()
    return pack_int4(q), pack_int4(zeros), scales


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--rows", default="1,4,16,64,256,512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps timed per variant per round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.kernels.cpu import int4, int8
    from kvdeck.kernels.cpu import native as cpu_native
    from kvdeck.kernels.cpu.linear import bf16_packing_supported
    from kvdeck.kernels.reference.w4a16_gemm import w4a16_gemm_torch

    if not int4.available() or not bf16_packing_supported():
        print("needs the CPU INT4 kernel and oneDNN bf16 (an x86 CPU with AVX512-BF16 and a C compiler)")
        return 1
    generator = torch.Generator().manual_seed(0)
    shapes, head = projection_shapes(args.model)
    awq = [random_awq(n, k, generator) for n, k in shapes]
    tiles = [int4.repack_awq(*weights, GROUP) for weights in awq]
    head_dense = torch.randn(*head, generator=generator).bfloat16()
    head_tiles = int8.from_dense(head_dense)
    packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k, generator=generator).bfloat16(), 1)
              for n, k in [*shapes, head]]
    dense = [torch.randn(n, k, generator=generator).bfloat16() for n, k in [*shapes, head]]
    bytes_read = {"int4": sum(t.nbytes for t in tiles) + head_tiles.tiles.numel(),
                  "bf16": sum(2 * n * k for n, k in [*shapes, head])}

    def int4_step(x_for):
        for t in tiles:
            int4.gemm(x_for(t.k), t)
        int8.gemm(x_for(head[1]), head_tiles)

    def dequantise_step(x_for):
        for (qweight, qzeros, scales), (_, k) in zip(awq, shapes):
            w4a16_gemm_torch(x_for(k), qweight, qzeros, scales.bfloat16(), GROUP)
        torch.ops.mkldnn._linear_pointwise(x_for(head[1]), packed[-1], None, "none", [], "")

    def bf16_step(x_for):
        for weight, (_, k) in zip(packed, [*shapes, head]):
            torch.ops.mkldnn._linear_pointwise(x_for(k), weight, None, "none", [], "")

    def bf16_gemv_step(x_for):
        for weight in dense:
            cpu_native.bf16_gemv(x_for(weight.shape[1]), weight)

    load_before = os.getloadavg()
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        widths = {k for _, k in [*shapes, head]}
        inputs = {k: torch.randn(rows, k, generator=generator).bfloat16() for k in widths}

        def x_for(k, inputs=inputs):
            return inputs[k]

        variants = {"int4": int4_step, "dequantise_bf16": dequantise_step}
        if rows <= cpu_native.GEMV_MAX_ROWS and cpu_native.available():
            variants["bf16_gemv"] = bf16_gemv_step
        else:
            variants["bf16_packed"] = bf16_step
        steps = args.steps if rows <= 64 else 1
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, step in variants.items():
                step(x_for)  # warm
                start = time.perf_counter()
                for _ in range(steps):
                    step(x_for)
                times[name].append((time.perf_counter() - start) / steps)
        ratios = {name: [other / own for own, other in zip(times["int4"], times[name])]
                  for name in variants if name != "int4"}
        row = {"rows": rows, "ms_per_step_median": {n: statistics.median(t) * 1e3 for n, t in times.items()},
               "int4_speedup_per_round": ratios,
               "int4_speedup_median": {n: statistics.median(r) for n, r in ratios.items()}}
        results.append(row)
        medians = row["ms_per_step_median"]
        print(f"rows {rows:4d}: " + "  ".join(f"{n} {v:8.2f} ms" for n, v in medians.items())
              + "  | int4 speed-up "
              + "  ".join(f"{n} {v:.2f}x" for n, v in row["int4_speedup_median"].items()), flush=True)
    config = {"model": args.model, "group_size": GROUP, "rounds": args.rounds, "steps": args.steps,
              "threads": torch.get_num_threads(), "int4_isa": int4.isa_name(), "bytes_per_step": bytes_read,
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("cpu_int4", config, {"results": results}))
        print(f"wrote {args.out}")
    else:
        print(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
