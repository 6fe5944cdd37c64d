"""W4A16 GEMM (AWQ INT4 weights, fp16 activations) against fp16 and bf16 cuBLAS.

For each weight shape K x N (in x out) and each M (tokens), times on one GPU:
  fp16      torch.matmul(x, W) with a dense fp16 weight (cuBLAS)
  bf16      the same in bf16 (what a bf16 model runs instead of INT4)
  triton    the fused GEMM on AutoAWQ's layout (w4a16_matmul_triton), its M bucket's config
  best      the fastest of a small sweep of tiles/split-K for that fused GEMM (not --no-sweep)
  dequant   the device-side dequantise + cuBLAS (what runs above FUSED_MAX_TOKENS)
  marlin    the repacked-layout kernel (kernels/triton/w4a16_marlin.py), what the engine
            runs with KVDECK_W4A16_KERNEL=marlin: fused up to its FUSED_MAX_TOKENS
  marlin_fused / marlin_dequant   that kernel's two paths at every M
  marlin_broadcast   its broadcast-load unpacking (BROADCAST_CONFIG), M <= 16
  marlin_pdl   `marlin` launched with programmatic dependent launch (kernels/triton/pdl.py; sm_90
            on, else the plain launch), M <= 16: back to back in a graph, each call's programs
            resident before the previous call ends
  marlin_plain   its fused GEMM dequantising in plain Triton (magic numbers) rather than the
            lop3 PTX that `marlin` runs on CUDA (kernels/triton/w4a16_lop3.py), M <= its FUSED_MAX_TOKENS
  auto      kernels.dispatch.w4a16_gemm(backend="auto"), the AWQ layout's engine path
and checks each result against the reference. A row's figures are timed side by side,
alternating (benchmarks/w4a16_sweep.py's `time_alternating`: medians of rounds), so each
ratio comes from one run. The memory-bound limit of the speed-up is the ratio of bytes
moved (fp16 weight vs int4 weight + scales + zeros). Each row is written as soon as it is
measured, with `summary`: per M, the fastest of marlin / triton / dequantise + cuBLAS
(benchmarks/w4a16_tune.py). --marlin-sweep then sweeps the repacked kernel's configs, split
counts and large-M path (the JSON w4a16_tune.py turns into kernels/triton/w4a16_marlin_tuned.py).
--marlin-sweep also times the table's marlin path again under the sweep's pick
(`marlin_tuned`), and `summary.targets` / `summary.targets_tuned` judge the W4A16 targets
on the table and on that. --e2e adds engine decode (benchmarks/w4a16_e2e.py) in bf16 and AWQ on
the repacked marlin kernel (under the sweep's pick when it ran), then both again with
programmatic dependent launch (after the anatomy).
At decode sizes the widest shape is also timed as a gate | up layer: its product then the
activation kernel (`marlin_act`) against the activation in the GEMM's epilogue over paired
columns (`marlin_gated`, what KVDECK_FUSED_ACTIVATION serves).
--anatomy last: at M = 1 on each shape, the marlin kernel beside part-kernels on its grid
(launch only; its loads; its loads and split-K epilogue) in graphs, where a decode-size
launch's time goes (benchmarks/w4a16_anatomy.py).

    python benchmarks/bench_w4a16.py                 # H100/H200: writes benchmarks/results/
    python benchmarks/bench_w4a16.py --cuda-graph    # time inside CUDA graphs (no launch cost)
    python benchmarks/bench_w4a16.py --cuda-graph --no-sweep --marlin-sweep --e2e --anatomy
                                                     # the battery's stage
    python benchmarks/bench_w4a16.py --e2e           # + decode tokens/s, Llama-3.2-1B shapes,
                                                     #   dummy AWQ INT4 vs dummy bf16 weights
    python benchmarks/bench_w4a16.py --check-graphs  # capture + replay at every decode bucket
    TRITON_INTERPRET=1 python benchmarks/bench_w4a16.py --smoke   # CPU: tiny shapes, fake clock
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from kvdeck.kernels.dispatch import w4a16_gemm  # noqa: E402
from kvdeck.kernels.reference.activation import silu_and_mul_torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_kernels  # noqa: E402
import w4a16_anatomy  # noqa: E402
import w4a16_e2e  # noqa: E402
import w4a16_sweep  # noqa: E402
import w4a16_tune  # noqa: E402
from w4a16_graph_check import check_graphs  # noqa: E402
from w4a16_problem import GROUP, SHAPES, Problem, checker  # noqa: E402

TOKENS = (1, 4, 16, 64, 256, 512)
# (block_m, block_n, block_k, split_k, num_warps, num_stages); each must fit 99 KiB of shared
# memory to run on sm_86/sm_89 (benchmarks/compile_for_gpu.py reports it).
SWEEP = (
    (16, 64, 128, 8, 4, 4),
    (16, 128, 64, 4, 8, 4),
    (16, 128, 64, 8, 8, 4),
    (16, 128, 64, 16, 8, 4),
    (16, 128, 128, 8, 8, 3),
    (16, 256, 64, 4, 8, 3),
    (32, 128, 64, 4, 8, 3),
    (64, 128, 64, 2, 8, 3),
    (64, 128, 64, 1, 4, 3),
    (128, 128, 32, 1, 8, 4),
    (128, 128, 64, 1, 8, 3),
)


REP_MS = 5  # ms of calls per CUDA graph, each replayed w4a16_sweep.ROUNDS times
# The widest shape (a gate | up layer's) at decode sizes is also timed as a gated layer.
GATED_MAX_TOKENS = 16


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def bench_shape(m: int, problem: Problem, timing: str | None, sweep: bool = True,
                gated: bool = False) -> dict:
    """One table row: every candidate checked, then (`timing`: cuda_graph, eager or fake)
    timed side by side with fp16 and bf16 cuBLAS, alternating. `gated`: the weight also as a
    gate | up layer, unfused and with the activation in the epilogue (`_gated_candidates`)."""
    from kvdeck.kernels.triton import w4a16_marlin as marlin
    from kvdeck.kernels.triton.launch import device_arch, pdl_forced
    from kvdeck.kernels.triton.w4a16_gemm import W4A16Config, awq_dequantize_triton, w4a16_matmul_triton

    k, n, qweight, qzeros, scales, repacked = (problem.k, problem.n, problem.qweight, problem.qzeros,
                                               problem.scales, problem.repacked)
    x, reference = problem.input(m)
    config = marlin.config_for(m, n, k, GROUP, x.device)
    fused_max = marlin.tuning(device_arch(x.device)).fused_max_tokens
    candidates = {
        "triton": lambda: w4a16_matmul_triton(x, qweight, qzeros, scales, GROUP),
        "dequant": lambda: x @ awq_dequantize_triton(qweight, qzeros, scales, GROUP, x.dtype),
        "marlin": lambda: marlin.w4a16_gemm_marlin(x, repacked),
        "marlin_fused": lambda: marlin.w4a16_matmul_marlin(x, repacked),
        "marlin_dequant": lambda: x @ marlin.dequantize_marlin(repacked, x.dtype),
        "auto": lambda: w4a16_gemm(x, qweight, qzeros, scales, GROUP),
    }
    if m <= fused_max:
        plain = dataclasses.replace(config, plain_dequant=True)
        candidates["marlin_plain"] = lambda: marlin.w4a16_matmul_marlin(x, repacked, config=plain)
    if m <= 16:
        candidates["marlin_broadcast"] = lambda: marlin.w4a16_matmul_marlin(
            x, repacked, config=marlin.BROADCAST_CONFIG)
        # The engine's launch with programmatic dependent launch (kernels/triton/pdl.py): in a
        # graph of back-to-back calls each one's programs wait resident for the previous.
        # (pdl_forced decorates: sm_90 on, elsewhere and under the interpreter the plain launch)
        candidates["marlin_pdl"] = pdl_forced(True)(lambda: marlin.w4a16_gemm_marlin(x, repacked))
    gated = _gated_candidates(problem, x) if gated else {}
    row: dict = {"m": m, "k": k, "n": n, "group_size": GROUP, "marlin_config": dataclasses.asdict(config),
                 "marlin_fused_max_tokens": fused_max, "marlin_lop3": marlin.uses_lop3(x.device, x.dtype)}
    check = checker()
    if gated:  # against the activation of the reference product
        gated_reference = silu_and_mul_torch(reference)
        for name, fn in gated.items():
            row[f"{name}_max_abs_err"] = check(f"{name} at m={m} k={k} n={n}", fn(), gated_reference)
        candidates.update(gated)
    for name, fn in list(candidates.items()):
        if name in gated:
            continue
        try:
            row[f"{name}_max_abs_err"] = check(f"{name} at m={m} k={k} n={n}", fn(), reference)
        except Exception as error:
            if name != "marlin_pdl":
                raise
            # A GPU that refuses the PDL launch (or a wrong result) is recorded, not timed.
            row["marlin_pdl_error"] = f"{type(error).__name__}: {error}"[:500]
            del candidates[name]
    if timing is None:
        return row
    # `marlin` is `marlin_fused` up to its fused_max_tokens, `marlin_dequant` above: each
    # figure timed once (likewise `auto`, the AWQ layout's two paths, without the sweep).
    candidates.pop("marlin_fused" if m <= fused_max else "marlin_dequant")
    if not sweep:
        candidates.pop("auto")
    x_bf16, dense_bf16 = x.to(torch.bfloat16), problem.dense.to(torch.bfloat16)
    dense = problem.dense
    timed = {"fp16": lambda: x @ dense, "bf16": lambda: x_bf16 @ dense_bf16, **candidates}
    if sweep:  # the AWQ-layout kernel's configs, timed in the same rounds
        for i, values in enumerate(SWEEP):
            cfg = W4A16Config(*values)
            if cfg.block_m > max(16, 2 * m):
                continue
            fn = lambda cfg=cfg: w4a16_matmul_triton(x, qweight, qzeros, scales, GROUP, config=cfg)  # noqa: E731
            check(f"sweep config {cfg} at m={m} k={k} n={n}", fn(), reference)
            timed[f"sweep{i}"] = fn
    ms = w4a16_sweep.time_alternating(timed, timing, REP_MS)
    row["fp16_ms"], row["bf16_ms"] = ms["fp16"], ms["bf16"]
    for name in candidates:
        row[f"{name}_ms"] = ms[name]
    int4_bytes = k * n // 2 + (k // GROUP) * n * (2 + 0.5)
    io_bytes = (m * k + m * n) * 2
    row["memory_bound_speedup_limit"] = (k * n * 2 + io_bytes) / (int4_bytes + io_bytes)
    for name in candidates:
        row[f"{name}_speedup_vs_fp16"] = row["fp16_ms"] / row[f"{name}_ms"]
        row[f"{name}_speedup_vs_bf16"] = row["bf16_ms"] / row[f"{name}_ms"]
    row["triton_weight_gb_per_s"] = (int4_bytes + io_bytes) / (row["triton_ms"] * 1e-3) / 1e9
    row["marlin_weight_gb_per_s"] = (int4_bytes + io_bytes) / (row["marlin_ms"] * 1e-3) / 1e9
    swept = {name: value for name, value in ms.items() if name.startswith("sweep")}
    if swept:
        best = min(swept, key=swept.get)
        row["best_ms"] = swept[best]
        row["best_config"] = dataclasses.asdict(W4A16Config(*SWEEP[int(best[5:])]))
        row["best_speedup_vs_fp16"] = row["fp16_ms"] / row["best_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    global REP_MS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, correctness only (CPU with TRITON_INTERPRET=1)")
    parser.add_argument("--cuda-graph", action="store_true", help="time inside CUDA graphs")
    parser.add_argument("--e2e", action="store_true",
                        help="also measure engine decode tokens/s, AWQ vs bf16 (dummy weights)")
    parser.add_argument("--no-sweep", action="store_true",
                        help="skip the AWQ-layout kernel's config sweep (the battery's quick table)")
    parser.add_argument("--rep-ms", type=float, default=REP_MS,
                        help="ms of calls per timed CUDA graph (each replayed in alternating rounds)")
    parser.add_argument("--marlin-sweep", action="store_true",
                        help="after the table: the repacked kernel's config sweep (w4a16_sweep.py), "
                             "which benchmarks/w4a16_tune.py turns into the per-arch table")
    parser.add_argument("--anatomy", action="store_true",
                        help="last: the marlin kernel at M = 1 beside part-kernels of its launch "
                             "(w4a16_anatomy.py), where its time goes")
    parser.add_argument("--check-graphs", action="store_true",
                        help="only check CUDA graph capture at every decode batch size")
    parser.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    REP_MS = args.rep_ms
    if args.check_graphs:
        if not torch.cuda.is_available() and not (args.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
            parser.error("--check-graphs needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)")
        check_graphs(smoke=not torch.cuda.is_available())
        return 0
    if args.smoke:
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("--smoke on CPU needs TRITON_INTERPRET=1")
        device, dtype = ("cuda", torch.float16) if torch.cuda.is_available() else ("cpu",
                                                                                   torch.float32)
        shapes, tokens, timing = ((256, 128), (128, 256)), (1, 4, 17), "fake"
        sweep_m = {"small_m": (1,), "large_m": (64,)}
    else:
        if not torch.cuda.is_available():
            parser.error("the benchmark needs a CUDA GPU (use --smoke to check it on CPU)")
        device, dtype = "cuda", torch.float16
        shapes, tokens = SHAPES, TOKENS
        timing = "cuda_graph" if args.cuda_graph else "eager"
        sweep_m = {}
    torch.manual_seed(0)
    rows: list[dict] = []
    e2e: list[dict] = []
    sweep_rows: list[dict] = []
    summary: dict = {}
    tuned: dict = {"entry": None, "rows": []}  # the sweep's pick and the table's marlin under it
    anatomy: list[dict] = []
    save = (_writer(args, device, dtype, rows, e2e, sweep_rows, summary, tuned, anatomy)
            if not args.smoke or args.out
            else lambda complete=False: None)
    problems = {}
    # The table first (every shape), then the sweep and the marlin path under its pick, then
    # e2e: a run cut off at its cap keeps what matters most.
    for k, n in shapes:
        problems[k, n] = problem = Problem.make(k, n, device, dtype)
        for m in tokens:
            gated = m <= GATED_MAX_TOKENS and n == max(width for _, width in shapes)
            row = bench_shape(m, problem, timing, not args.no_sweep, gated)
            rows.append(row)
            summary.clear()
            summary.update(w4a16_tune.summarise_table(rows))
            save()
            _print_row(row, timing)
    if args.marlin_sweep:
        timer = lambda fns: w4a16_sweep.time_alternating(fns, timing, REP_MS)  # noqa: E731
        for (k, n), problem in problems.items():
            sweep_rows += w4a16_sweep.sweep_shape(problem, torch.device(device), timer, checker(), **sweep_m)
            save()
            print(f"sweep K={k} N={n}: {len(sweep_rows)} rows", flush=True)
        summary.update(w4a16_tune.summarise_sweep(sweep_rows, rows))
        save()
        # The sweep's pick, installed in this process (and e2e's marlin engine), the table's
        # marlin path timed again under it: the targets' figures from this lease.
        from kvdeck.kernels.triton import w4a16_marlin as marlin
        from kvdeck.kernels.triton.launch import device_arch

        tuned["entry"] = w4a16_tune.entry_from_sweep(
            summary["tuned"], f"this run's sweep ({device}, {git_commit()[:12]}), not committed")
        marlin.use_tuning(device_arch(torch.device(device)), tuned["entry"])
        for key, problem in problems.items():
            tuned["rows"] += w4a16_sweep.tuned_rows({key: problem}, tokens, timer, checker())
            summary["targets_tuned"] = w4a16_tune.targets(tuned["rows"], e2e)
            summary.update(w4a16_tune.summarise_table(rows, tuned["rows"]))  # w4a16_auto, tuned
            save()
    summary["targets"] = w4a16_tune.targets(rows, e2e)
    save()
    for line in w4a16_tune.report(summary):
        print(line, flush=True)

    def run_e2e(variants: tuple[str, ...]) -> None:
        for variant in variants:
            try:
                e2e.append(w4a16_e2e.run_variant(variant, args.smoke, tuned["entry"]))
            except RuntimeError as error:  # one engine's failure is its row; the others still run
                e2e.append({"variant": variant, "error": str(error)[-3000:], "runs": []})
                print(f"e2e {variant} failed: {str(error)[-500:]}", flush=True)
            summary["targets"] = w4a16_tune.targets(rows, e2e)
            if tuned["rows"]:
                summary["targets_tuned"] = w4a16_tune.targets(tuned["rows"], e2e)
            summary.update(w4a16_tune.summarise_table(rows, tuned["rows"]))  # w4a16_auto, tuned
            summary["e2e_pdl"] = w4a16_tune.pdl_effect(e2e)
            summary["e2e_fused_activation"] = w4a16_tune.twin_effect(e2e, "_unfused")
            save()
            for run in e2e[-1]["runs"]:
                print(f"e2e {variant:10s} batch {run['batch']:3d}: "
                      f"{run['output_tokens_per_s']:9.1f} tok/s  "
                      f"ITL {run['mean_inter_token_latency_ms']:.2f} ms", flush=True)
                if "kernels" in run:
                    print(f"    profiled: {step_kernels.summary_line(run['kernels'])}", flush=True)
        verdicts = {key: value for key, value in summary.items()
                    if key.startswith(("targets", "e2e_pdl", "e2e_fused_activation"))}
        for line in w4a16_tune.report(verdicts):
            print(line, flush=True)

    # The target's pair of engines, then the anatomy, then their PDL twins: a stage cut at its
    # cap loses the least needed first.
    if args.e2e:
        run_e2e(w4a16_e2e.VARIANTS[:2])
    if args.anatomy:  # under the sweep's pick when it ran (installed above)
        timer = lambda fns: w4a16_sweep.time_alternating(fns, timing, REP_MS)  # noqa: E731
        for key, problem in problems.items():
            anatomy += w4a16_anatomy.anatomy_rows({key: problem}, torch.device(device), timer, checker())
            save()
            print(w4a16_anatomy.describe(anatomy[-1]), flush=True)
    if args.e2e:
        run_e2e(w4a16_e2e.VARIANTS[2:])
    save(complete=True)
    return 0


def _gated_candidates(problem: Problem, x: torch.Tensor) -> dict:
    """The weight as a gate | up layer (two halves of N): its product then the activation
    kernel (`marlin_act`, the unfused engine's two launches) and the activation in the GEMM's
    epilogue over the paired columns (`marlin_gated`, one launch; KVDECK_FUSED_ACTIVATION)."""
    from kvdeck.kernels.reference.w4a16_repack import pair_halves
    from kvdeck.kernels.triton import w4a16_marlin as marlin
    from kvdeck.kernels.triton.activation import silu_and_mul_triton

    paired = pair_halves(problem.repacked)
    return {"marlin_act": lambda: silu_and_mul_triton(marlin.w4a16_gemm_marlin(x, problem.repacked)),
            "marlin_gated": lambda: marlin.w4a16_gemm_marlin(x, paired, activation="silu")}


def _print_row(row: dict, timing: str) -> None:
    m, k, n = row["m"], row["k"], row["n"]
    if "fp16_ms" not in row or timing == "fake":
        print(f"ok M={m} K={k} N={n} triton err {row['triton_max_abs_err']:.2e} "
              f"marlin err {row['marlin_max_abs_err']:.2e}", flush=True)
        return
    best = (f"  best {row['best_ms'] * 1e3:8.1f} us ({row['best_speedup_vs_fp16']:.2f}x)"
            if "best_ms" in row else "")
    plain = (f"  plain {row['marlin_plain_ms'] * 1e3:8.1f} us" if "marlin_plain_ms" in row else "")
    plain += (f"  pdl {row['marlin_pdl_ms'] * 1e3:8.1f} us ({row['marlin_pdl_speedup_vs_bf16']:.2f}x)"
              if "marlin_pdl_ms" in row else "")
    plain += (f"  gated {row['marlin_gated_ms'] * 1e3:8.1f} us vs act {row['marlin_act_ms'] * 1e3:8.1f} us"
              if "marlin_gated_ms" in row else "")
    print(f"M={m:4d} K={k:5d} N={n:5d}  fp16 {row['fp16_ms'] * 1e3:8.1f} us  "
          f"bf16 {row['bf16_ms'] * 1e3:8.1f} us  "
          f"triton {row['triton_ms'] * 1e3:8.1f} us ({row['triton_speedup_vs_bf16']:.2f}x bf16)"
          f"  marlin {row['marlin_ms'] * 1e3:8.1f} us ({row['marlin_speedup_vs_bf16']:.2f}x bf16)"
          f"{plain}{best}  dequant {row['dequant_ms'] * 1e3:8.1f} us  "
          f"limit {row['memory_bound_speedup_limit']:.2f}x", flush=True)


def _writer(args: argparse.Namespace, device: str, dtype: torch.dtype, rows: list[dict],
            e2e: list[dict], sweep_rows: list[dict], summary: dict, tuned: dict, anatomy: list[dict]):
    """What writes the result JSON, called after every row (a run cut short keeps its rows)."""
    import triton

    from kvdeck.kernels.triton.w4a16_gemm import FUSED_MAX_TOKENS

    result = {
        "benchmark": "w4a16_gemm",
        "device": (torch.cuda.get_device_name() if device == "cuda"
                   else platform.processor() or "cpu"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "timing": (f"fake clock (--smoke: every timing {w4a16_sweep.FAKE_MS} ms)" if args.smoke
                   else ("cuda_graph" if args.cuda_graph else "eager")
                   + f", alternating: median of {w4a16_sweep.ROUNDS} rounds of {REP_MS} ms"),
        "loadavg": os.getloadavg(),
        "sm": (_sm(device)),
        "dtype": str(dtype).replace("torch.", ""),
        "fused_max_tokens": FUSED_MAX_TOKENS,
        "sweep": not args.no_sweep,
        "rep_ms": REP_MS,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "results": rows,
        "summary": summary,
        "marlin_sweep": sweep_rows,
        # The table's marlin path under the sweep's pick (w4a16_sweep.tuned_rows), and the pick
        # (what w4a16_tune.py would write; e2e's marlin engine ran it too).
        "marlin_tuned": tuned["rows"],
        "marlin_tuned_entry": None,
        "e2e_decode": e2e,
        "anatomy": anatomy,  # --anatomy: w4a16_anatomy.anatomy_rows
        "complete": False,
    }
    out = Path(args.out) if args.out else (
        REPO / "benchmarks" / "results"
        / f"w4a16_{result['device'].replace(' ', '_')}_{result['date_utc'][:10]}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(complete: bool = False) -> None:
        result["complete"] = complete
        result["marlin_tuned_entry"] = tuned["entry"]
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(out)
        if complete:
            print(f"wrote {out}")

    return save


def _sm(device: str) -> int | None:
    """The SM version (90 for sm_90) the tuned table is keyed by; None off CUDA."""
    if device != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


if __name__ == "__main__":
    sys.exit(main())
