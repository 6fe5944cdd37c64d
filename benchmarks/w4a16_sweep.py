"""The repacked W4A16 kernel's config sweep (bench_w4a16.py --marlin-sweep) and the timer the
W4A16 bench shares: candidates timed side by side, alternating.

`time_alternating(fns)`: each candidate is captured once in a CUDA graph of n calls (n fills
about `rep_ms`), then the graphs replay in rounds, each round in a rotated order, and each
candidate's figure is the median of its rounds: every ratio in a row comes from one run with
the two sides alternating. `eager` replays the n calls without a graph; `fake` (the CPU smoke
run) calls each once and reads FAKE_MS.

The sweep, per weight shape (Llama-3-8B's), each group timed together with bf16 cuBLAS:
  config  M <= 16 (M = 1 and 16): MarlinConfig candidates for the decode bucket
  gemv    M = 1, in the same rounds: the GEMV form's candidates (GEMV_CONFIGS)
  split   M = 1 and 16, the bucket's config: every split count a launch can run, with the wave
          efficiency `choose_split`'s model gives each for 1..8 programs per SM
  large   M = 32, 64, 256, 512: fused configs of the 32, 64 and 256 buckets (at each M those of
          the buckets that could serve it) against dequantise + cuBLAS
A candidate that fails (a launch the GPU refuses, a wrong result) leaves an `error` row and
the others go on: one bad config does not cost the lease its sweep.
benchmarks/w4a16_tune.py turns the JSON into the per-architecture table the kernel reads.

`tuned_rows` then times the table's `marlin` path again under the sweep's pick (installed in
the process by w4a16_marlin_plan.use_tuning), each (shape, M) against bf16 cuBLAS: the
figures the W4A16 targets (w4a16_tune.targets) are judged on, from the same lease as the sweep.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import torch

FAKE_MS = 1.0
# A candidate's graph holds this many ms of calls; ROUNDS replays of each, alternating.
ROUNDS = 7
# Each at most its bucket's shared memory on sm_90 (the sweep's configs must compile there).
SMALL_M = (1, 16)
SMALL_M_CONFIGS = (  # (block_m, block_n, block_k, split_k max, num_warps, num_stages[, broadcast_load,
    # plain_dequant, swap_ab]): MarlinConfig's fields in order
    (16, 64, 128, 16, 4, 4),  # the default
    (16, 64, 128, 16, 4, 6),
    (16, 128, 128, 16, 4, 4),
    (16, 128, 128, 16, 8, 4),
    (16, 64, 64, 32, 4, 5),
    (16, 256, 128, 8, 8, 3),
    (16, 128, 128, 16, 4, 4, False, False, True),  # swapped: wgmma on sm_90 (SWAP_CONFIG)
    (16, 64, 128, 16, 4, 4, False, False, True),
)
# The GEMV form (kernels/triton/w4a16_gemv.py: no tensor cores, one row a program) at M = 1,
# timed in the decode bucket's group: w4a16_tune serves it to batch 1 where it beats the bucket's
# pick there. MarlinConfig's fields in order, `gemv` last; the first is GEMV_CONFIG.
GEMV_CONFIGS = tuple((*values, False, False, False, True) for values in (
    (1, 128, 128, 16, 4, 4),  # the default (sm_90: 3.11 / 3.28 instructions a weight, no spills)
    (1, 64, 128, 16, 4, 4),
    (1, 256, 128, 16, 4, 3),  # 2.77 a weight, 128 registers
    (1, 256, 128, 16, 8, 3),  # 3.06, 80 registers
    (1, 128, 64, 32, 4, 6),
))
GEMV_M = 1
LARGE_M = (32, 64, 256, 512)
LARGE_M_CONFIGS = {  # bucket limit -> candidates (the first is the default)
    32: ((32, 64, 128, 8, 4, 4), (32, 128, 128, 8, 4, 4), (32, 128, 64, 8, 8, 4),
         (32, 128, 128, 8, 4, 4, False, False, True)),
    # The 64-row tiles issue wgmma on sm_90 with the dequantised tile staged through shared
    # memory, each K step waiting for its wgmma (WARPGROUP.DEPBAR.LE gsb0, 0x0) behind three
    # barriers; 32-row tiles (two programs along M, each dequantising) use mma.sync from
    # registers, as the 32 bucket does (0.80-1.10x at M = 32 against 0.46-0.78x at M = 64).
    # Swapped, the dequantised weights are wgmma's register operand (HGMMA.64x64x16 R, gdesc).
    64: ((64, 128, 64, 4, 8, 3), (64, 128, 128, 4, 8, 3), (64, 256, 64, 2, 8, 3),
         (32, 64, 128, 8, 4, 4), (32, 128, 128, 4, 4, 4), (64, 128, 64, 4, 4, 3, False, False, True)),
    # (128, 128, 64, 1, 4, 4) held 255 registers and spilled on sm_90 and sm_80: 8 warps here.
    256: ((128, 128, 64, 2, 8, 3), (128, 256, 64, 2, 8, 3), (128, 128, 64, 1, 8, 4)),
}
PROGRAMS_PER_SM_CHOICES = (1, 2, 3, 4, 6, 8)


def time_alternating(fns: dict[str, Callable[[], object]], mode: str, rep_ms: float,
                     rounds: int = ROUNDS) -> dict[str, float]:
    """ms per call of each candidate: the median over `rounds` alternating timings."""
    if mode == "fake":
        for fn in fns.values():
            fn()
        return {name: FAKE_MS for name in fns}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        runs = {name: _repeated(fn, mode, rep_ms) for name, fn in fns.items()}
        samples: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                run, calls = runs[name]
                start.record()
                run()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def _repeated(fn: Callable[[], object], mode: str, rep_ms: float) -> tuple[Callable[[], object], int]:
    """(what runs `calls` calls of fn, calls), sized from a short first timing."""
    fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    estimate_ms = max(1e-3, (time.perf_counter() - begin) * 1e3 / 3)  # with launch cost: an upper bound
    calls = max(1, min(2000, int(rep_ms / estimate_ms)))
    if mode == "eager":
        return (lambda: [fn() for _ in range(calls)]), calls
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay, calls


def _config(values: tuple, **changes):
    from kvdeck.kernels.triton.w4a16_marlin import MarlinConfig

    return replace(MarlinConfig(*values), **changes)


def sweep_shape(problem, device: torch.device, timer: Callable[[dict], dict[str, float]],
                check: Callable[[str, torch.Tensor, torch.Tensor], None], small_m=SMALL_M,
                large_m=LARGE_M) -> list[dict]:
    """Every sweep row of one weight shape (`problem`: w4a16_problem.Problem)."""
    from kvdeck.kernels.triton.w4a16_gemm import streaming_multiprocessors

    num_sms = streaming_multiprocessors(device)
    rows: list[dict] = []
    for m in small_m:
        rows += _small_m_rows(problem, m, num_sms, timer, check)
    for m in large_m:
        rows += _large_m_rows(problem, m, num_sms, timer, check)
    return rows


def _fitted(values: tuple, m: int, n: int, k: int, group: int, num_sms: int):
    """A swept config as a launch runs it: block_k fitted to the group, split_k to the SMs."""
    from kvdeck.kernels.triton.w4a16_marlin_plan import PROGRAMS_PER_SM, choose_split

    cfg = _config(values, block_k=min(values[2], group))
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    return replace(cfg, split_k=choose_split(tiles, k // cfg.block_k, cfg.split_k, PROGRAMS_PER_SM * num_sms))


def _small_m_rows(problem, m: int, num_sms: int, timer, check) -> list[dict]:
    from kvdeck.kernels.triton import w4a16_marlin as marlin
    from kvdeck.kernels.triton.w4a16_marlin_plan import split_tiles, wave_efficiency

    k, n, group = problem.k, problem.n, problem.group
    x, reference = problem.input(m)
    dense_bf16, x_bf16 = problem.dense.to(torch.bfloat16), x.to(torch.bfloat16)
    fns = {"bf16": lambda: x_bf16 @ dense_bf16}
    configs = {}
    for values in SMALL_M_CONFIGS:
        cfg = _fitted(values, m, n, k, group, num_sms)
        name = f"config{len(configs)}"
        configs[name] = (values, cfg)
        fns[name] = lambda cfg=cfg: marlin.w4a16_matmul_marlin(x, problem.repacked, config=cfg)
    gemvs = {}
    for values in GEMV_CONFIGS if m == GEMV_M else ():
        cfg = _fitted(values, m, n, k, group, num_sms)
        gemvs[name := f"gemv{len(gemvs)}"] = (values, cfg)
        fns[name] = lambda cfg=cfg: marlin.w4a16_matmul_marlin(x, problem.repacked, config=cfg)
    # Every split count the decode bucket's config can run, the model's efficiency for each.
    base = _config(SMALL_M_CONFIGS[0], block_k=min(SMALL_M_CONFIGS[0][2], group))
    tiles, k_tiles = -(-m // base.block_m) * -(-n // base.block_n), k // base.block_k
    splits = [s for s in range(1, 2 * base.split_k + 1)
              if (s == 1 or k_tiles // s >= 2) and split_tiles(k_tiles, s)[1] == s]
    for split in splits:
        fns[f"split{split}"] = lambda s=split: marlin.w4a16_matmul_marlin(
            x, problem.repacked, config=replace(base, split_k=s))
    fns, rows = _runnable(fns, check, m, k, n, reference)
    ms = timer(fns)
    rows += [{"kind": "config", "m": m, "k": k, "n": n, "values": list(values), "config": asdict(cfg),
              "ms": ms[name], "bf16_ms": ms["bf16"]} for name, (values, cfg) in configs.items() if name in ms]
    rows += [{"kind": "gemv", "m": m, "k": k, "n": n, "values": list(values), "config": asdict(cfg),
              "ms": ms[name], "bf16_ms": ms["bf16"]} for name, (values, cfg) in gemvs.items() if name in ms]
    for split in (split for split in splits if f"split{split}" in ms):
        efficiency = {str(p): round(wave_efficiency(tiles, k_tiles, split, p * num_sms), 4)
                      for p in PROGRAMS_PER_SM_CHOICES}
        rows.append({"kind": "split", "m": m, "k": k, "n": n, "values": list(SMALL_M_CONFIGS[0]),
                     "tiles": tiles, "k_tiles": k_tiles, "num_sms": num_sms, "split": split,
                     "ms": ms[f"split{split}"], "bf16_ms": ms["bf16"], "wave_efficiency": efficiency})
    return rows


def _large_m_rows(problem, m: int, num_sms: int, timer, check) -> list[dict]:
    from kvdeck.kernels.triton import w4a16_marlin as marlin

    k, n, group = problem.k, problem.n, problem.group
    x, reference = problem.input(m)
    dense_bf16, x_bf16 = problem.dense.to(torch.bfloat16), x.to(torch.bfloat16)
    fns = {"bf16": lambda: x_bf16 @ dense_bf16,
           "dequant": lambda: x @ marlin.dequantize_marlin(problem.repacked, x.dtype)}
    configs = {}
    # The buckets that could serve M (the largest serves every M above it: M = 512's row says
    # how the fused kernel fares past the buckets).
    serving = [limit for limit in LARGE_M_CONFIGS if limit >= m] or [max(LARGE_M_CONFIGS)]
    for limit in serving:
        for values in LARGE_M_CONFIGS[limit]:
            cfg = _fitted(values, m, n, k, group, num_sms)
            name = f"bucket{limit}_{len(configs)}"
            configs[name] = (limit, values, cfg)
            fns[name] = lambda cfg=cfg: marlin.w4a16_matmul_marlin(x, problem.repacked, config=cfg)
    fns, rows = _runnable(fns, check, m, k, n, reference)
    ms = timer(fns)
    if "dequant" in ms:
        rows.append({"kind": "large", "m": m, "k": k, "n": n, "path": "dequant", "ms": ms["dequant"],
                     "bf16_ms": ms["bf16"]})
    for name, (limit, values, cfg) in configs.items():
        if name in ms:
            rows.append({"kind": "large", "m": m, "k": k, "n": n, "path": "fused", "bucket": limit,
                         "values": list(values), "config": asdict(cfg), "ms": ms[name],
                         "bf16_ms": ms["bf16"]})
    return rows


def _runnable(fns: dict, check, m: int, k: int, n: int, reference: torch.Tensor) -> tuple[dict, list[dict]]:
    """The candidates that run and are right (bf16 cuBLAS, the yardstick, must), and an
    `error` row for each other one."""
    kept, errors = {}, []
    for name, fn in fns.items():
        try:
            check(f"sweep {name} m={m} k={k} n={n}", fn(), reference)
        except Exception as exc:  # noqa: BLE001  (a refused launch is a RuntimeError or a triton error)
            if name == "bf16":
                raise
            errors.append({"kind": "error", "m": m, "k": k, "n": n, "candidate": name,
                           "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"sweep {name} m={m} k={k} n={n} left out: {errors[-1]['error']}", flush=True)
            continue
        kept[name] = fn
    return kept, errors


def tuned_rows(problems: dict, tokens: tuple[int, ...], timer, check) -> list[dict]:
    """The table's `marlin` (the engine's path: fused up to the tuning's fused limit, else
    dequantise + cuBLAS) again, under the tuning `use_tuning` installed, each (shape, M)
    timed together with bf16 cuBLAS: the speed-ups the sweep's pick gives."""
    from kvdeck.kernels.triton import w4a16_marlin as marlin
    from kvdeck.kernels.triton.launch import device_arch

    rows = []
    for problem in problems.values():
        k, n, repacked, dense_bf16 = problem.k, problem.n, problem.repacked, problem.dense.to(torch.bfloat16)
        for m in tokens:
            x, reference = problem.input(m)
            x_bf16 = x.to(torch.bfloat16)
            fns = {"bf16": lambda x_bf16=x_bf16, dense_bf16=dense_bf16: x_bf16 @ dense_bf16,
                   "marlin": lambda x=x, repacked=repacked: marlin.w4a16_gemm_marlin(x, repacked)}
            check(f"tuned marlin m={m} k={k} n={n}", fns["marlin"](), reference)
            ms = timer(fns)
            arch_tuning = marlin.tuning(device_arch(x.device))
            rows.append({"m": m, "k": k, "n": n, "fused": m <= arch_tuning.fused_max_tokens,
                         "config": asdict(marlin.config_for(m, n, k, problem.group, x.device)),
                         "bf16_ms": ms["bf16"], "marlin_ms": ms["marlin"],
                         "marlin_speedup_vs_bf16": ms["bf16"] / ms["marlin"]})
    return rows
