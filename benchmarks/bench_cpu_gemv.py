"""The bf16 CPU GEMV kernel (kernels/cpu/native.py) against oneDNN's packed GEMM and aten's
plain bf16 `F.linear`, over a whole model's projections as one decode step reads them.

For each row count, one "step" runs every projection of the model once (per layer: the
merged qkv, o, the merged gate_up, down; then the output head), each variant on its own
copy of the weights, so the weights stream from memory as in a real step (SmolLM2's 270 MB
do not fit in any cache; the demo's 12 MB do). Variants alternate within each round; the
ratio is per round, against oneDNN's packed weight (the path the kernel replaces).

    python benchmarks/bench_cpu_gemv.py --model smollm2 --out benchmarks/results/cpu_gemv_smollm2.json
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (layers, hidden, intermediate, q heads, kv heads, head dim, vocab)
MODELS = {"demo": (6, 256, 768, 4, 2, 64, 4096), "smollm2": (30, 576, 1536, 9, 3, 64, 49152)}


def projection_shapes(model: str) -> list[tuple[int, int]]:
    layers, hidden, inter, heads, kv_heads, head_dim, vocab = MODELS[model]
    per_layer = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
                 (2 * inter, hidden), (hidden, inter)]
    return per_layer * layers + [(vocab, hidden)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per variant per round")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck.kernels.cpu import native as cpu_native
    from kvdeck.kernels.cpu.linear import bf16_packing_supported

    if not cpu_native.available() or not bf16_packing_supported():
        print("needs the CPU GEMV kernel and oneDNN bf16 (an x86 CPU with AVX512-BF16 and a C compiler)")
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = projection_shapes(args.model)
    weight_bytes = sum(n * k * 2 for n, k in shapes)
    plain = [torch.randn(n, k).bfloat16() for n, k in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).bfloat16(), 1) for n, k in shapes]
    native = [torch.randn(n, k).bfloat16() for n, k in shapes]

    def step(variant: str, inputs: dict[int, torch.Tensor]) -> None:
        if variant == "kvdeck_gemv":
            for w in native:
                cpu_native.bf16_gemv(inputs[w.shape[1]], w)
        elif variant == "onednn_packed":
            for w in packed:
                torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], w, None, "none", [], "")
        else:
            for w in plain:
                F.linear(inputs[w.shape[1]], w)

    variants = ["onednn_packed", "kvdeck_gemv", "aten_plain"]
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        inputs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes}
        for variant in variants:
            step(variant, inputs)  # warm-up
        times: dict[str, list[float]] = {v: [] for v in variants}
        for index in range(args.rounds):
            for variant in variants if index % 2 == 0 else variants[::-1]:
                started = time.perf_counter()
                for _ in range(args.steps):
                    step(variant, inputs)
                times[variant].append((time.perf_counter() - started) / args.steps)
        row = {"rows": rows}
        for variant in variants:
            ratios = [ref / mine for ref, mine in zip(times["onednn_packed"], times[variant])]
            median = statistics.median(times[variant])
            row[variant] = {"ms_per_step": median * 1e3, "weight_GB_per_s": weight_bytes / median / 1e9,
                            "speedup_vs_onednn_packed": statistics.median(ratios),
                            "speedup_range": [min(ratios), max(ratios)]}
        results.append(row)
        print(f"rows {rows:3d}: " + "  ".join(
            f"{v} {row[v]['ms_per_step']:.2f} ms ({row[v]['weight_GB_per_s']:.0f} GB/s, "
            f"{row[v]['speedup_vs_onednn_packed']:.2f}x)" for v in variants), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "cpu_gemv", "model_shapes": args.model, "weight_bytes": weight_bytes,
            "threads": torch.get_num_threads(), "rounds": args.rounds, "steps_per_round": args.steps,
            "load_average_after": os.getloadavg()[0], "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
