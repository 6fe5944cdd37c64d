"""The CPU matmul and rotary choices of kernels/cpu/linear.py and kernels/reference/rope.py, timed in
turns in one process: for each weight shape and row count, fp32 `F.linear`, bf16 `F.linear`,
bf16 on a oneDNN-packed weight, and int8 weight-only (aten's matrix-vector kernel, and
dequantise + bf16 GEMM); and rotary on q and k separately against both in one pass.

    python benchmarks/bench_cpu_matmul.py --out benchmarks/results/cpu_matmul.json

Each figure is the median over rounds of the mean time per call; each round runs every
variant once, in an order that alternates, so load that comes and goes hits them alike.
Ratios are against fp32 `F.linear` (matmuls) and separate q, k rotation (rotary), per round.
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, out_features, in_features): the demo model's and SmolLM2-135M's projections.
SHAPES = [("demo gate_up", 1536, 256), ("demo down", 256, 768), ("demo lm_head", 4096, 256),
          ("smollm2 qkv", 960, 576), ("smollm2 gate_up", 3072, 576), ("smollm2 down", 576, 1536),
          ("smollm2 lm_head", 49152, 576)]
ROWS = [1, 4, 8, 16, 64]


def timed(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def in_turns(variants: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, list[float]]:
    for fn in variants.values():
        fn()  # warm-up: oneDNN primitives, allocator
    runs: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            runs[name].append(timed(variants[name], calls))
    return runs


def summarise(runs: dict[str, list[float]], reference: str) -> dict:
    out = {}
    for name, times in runs.items():
        ratios = [ref / mine for ref, mine in zip(runs[reference], times)]
        out[name] = {"time_per_call_us": statistics.median(times) * 1e6,
                     "speedup_vs_" + reference: statistics.median(ratios),
                     "speedup_range": [min(ratios), max(ratios)]}
    return out


def matmul_variants(out_features: int, in_features: int, rows: int) -> dict[str, Callable[[], object]]:
    from kvdeck.kernels.cpu.linear import (
        bf16_packing_supported,
        pack_bf16_weight,
        packed_linear,
        quantize_int8,
    )

    weight = torch.randn(out_features, in_features) * 0.05
    x = torch.randn(rows, in_features)
    w16, x16 = weight.to(torch.bfloat16), x.to(torch.bfloat16)
    qweight, scales = quantize_int8(weight)
    scales16 = scales.to(torch.bfloat16)
    variants = {
        "fp32": lambda: F.linear(x, weight),
        "bf16": lambda: F.linear(x16, w16),
        "int8_gemv": lambda: torch._weight_int8pack_mm(x16, qweight, scales16),
        "int8_dequant_bf16": lambda: F.linear(x16, qweight.to(torch.bfloat16) * scales16[:, None]),
    }
    if bf16_packing_supported():
        packed, number = pack_bf16_weight(w16)
        variants["bf16_packed"] = lambda: (packed, packed_linear(x16, number, out_features))
    return variants


def rope_variants(tokens: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, Callable[[], object]]:
    from kvdeck.kernels.reference.rope import _cos_sin, _rotate, apply_rope_torch, build_cos_sin_cache

    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cache = build_cos_sin_cache(inv_freq, 4096)
    positions = torch.arange(tokens) + 100
    q, k = torch.randn(tokens, heads, head_dim), torch.randn(tokens, kv_heads, head_dim)
    cos, sin = _cos_sin(positions, cache, True)  # looked up once per step either way
    return {
        "q_and_k_separately": lambda: (_rotate(q, cos, sin, True), _rotate(k, cos, sin, True)),
        "q_and_k_together": lambda: apply_rope_torch(positions, q, k, cache, True),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    matmuls = {}
    for name, out_features, in_features in SHAPES:
        for rows in ROWS:
            runs = in_turns(matmul_variants(out_features, in_features, rows), args.rounds, args.calls)
            key = f"{name} [{out_features}x{in_features}] rows={rows}"
            matmuls[key] = summarise(runs, "fp32")
            print(key, "  ".join(f"{v}: {s['time_per_call_us']:.1f} us (x{s['speedup_vs_fp32']:.2f})"
                                 for v, s in matmuls[key].items()), flush=True)
    rotary = {}
    for name, tokens, heads, kv_heads in [("demo decode", 1, 4, 2), ("smollm2 decode", 1, 9, 3),
                                          ("smollm2 batch 32", 32, 9, 3)]:
        runs = in_turns(rope_variants(tokens, heads, kv_heads, 64), args.rounds, args.calls * 5)
        rotary[name] = summarise(runs, "q_and_k_separately")
        print(name, "  ".join(f"{v}: {s['time_per_call_us']:.1f} us "
                              f"(x{s['speedup_vs_q_and_k_separately']:.2f})"
                              for v, s in rotary[name].items()), flush=True)
    if args.out:
        from kvdeck.app.bench.result import build_result, write_json_atomic

        config = {key: value for key, value in vars(args).items() if key != "out"}
        config["load_average_before_after"] = [load_before, os.getloadavg()]
        write_json_atomic(Path(args.out), build_result("cpu_matmul", config,
                                                       {"matmul": matmuls, "rotary": rotary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
