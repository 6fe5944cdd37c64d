"""Host work per step of two checkouts of kvdeck, in turns: `kvdeck bench throughput` on the
same workload in each, and the ratio A / B.

Each side runs the bench command in a process of its own that imports its checkout's kvdeck
(the editable install pointed at the checkout, as bench_decode_ab.py does; `git worktree add
/tmp/base COMMIT` gives the other side). Host work per step is measured the same way on both
sides: the wall time of the timed run outside the model and the sampler, over the steps (the
caller's loop, which reads the occupancy every step, and the front-end included); a side
that reports its host phases (schedule, prepare, update, front-end) has them in the JSON too.
Sides alternate, and which goes first alternates; the figure is the median of the per-pair
ratios. The load average is recorded around each run.

Flags after `--` go to `kvdeck bench throughput` on both sides (`-- --load-format dummy`
for a config without weights). Before each pair the script waits (up to --max-wait seconds)
for the 1-minute load average to come down to --max-load, and records it.

    git worktree add /tmp/host_base BASE_COMMIT
    python benchmarks/bench_host_ab.py /tmp/host_base . --model benchmarks/configs/tiny-llama-2l \\
        --pairs 5 --out benchmarks/results/host_work_ab_cpu.json -- --load-format dummy
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_decode_ab import CHECKOUT_PRELUDE  # this folder is first on sys.path

SIDE = CHECKOUT_PRELUDE + """
if not kvdeck.kernels.__file__.startswith(sys.argv[1] + "/"):
    raise SystemExit(f"imported kvdeck from {kvdeck.kernels.__file__}")
from kvdeck.app.cli import main
raise SystemExit(main(sys.argv[2:]))
"""

# The workload of the CPU target: 256 requests, 100-500 tokens in and out, max_model_len 1024.
WORKLOAD = ["--num-prompts", "256", "--input-len", "100:500", "--output-len", "100:500",
            "--max-model-len", "1024", "--device", "cpu"]


def run_side(checkout: Path, model: str, extra: list[str]) -> dict:
    root = str(checkout.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        load_before = os.getloadavg()
        done = subprocess.run([sys.executable, "-c", SIDE, root, "bench", "throughput", "--model", model,
                               *WORKLOAD, *extra, "--out", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench throughput failed in {checkout} ({done.returncode}):\n"
                               f"{done.stderr[-4000:]}")
        result = json.loads(out.read_text())
    figures = result["kvdeck"]
    breakdown = figures["step_time_breakdown_s"]
    steps = figures["steps"]
    host = (figures["elapsed_s"] - breakdown["model_and_sampling"]) / steps
    return {"commit": result.get("commit"), "host_s_per_step": host, "steps": steps,
            "elapsed_s": figures["elapsed_s"], "output_tokens_per_s": figures["output_tokens_per_s"],
            "schedule_prepare_update_s_per_step": (breakdown["schedule"] + breakdown["prepare_inputs"]
                                                   + breakdown["update_outputs"]) / steps,
            # Each host phase per step, the front-end's included (sides that report it).
            "host_work_per_step_s": figures.get("host_work_per_step_s"),
            "load_average": [load_before, os.getloadavg()]}


def wait_for_quiet(max_load: float, max_wait_s: float) -> dict:
    """Wait while the 1-minute load average is above max_load (at most max_wait_s)."""
    started = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() - started < max_wait_s:
        time.sleep(15)
    return {"waited_s": round(time.monotonic() - started, 1), "load_average": os.getloadavg(),
            "quiet": os.getloadavg()[0] <= max_load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the baseline checkout")
    parser.add_argument("b", type=Path, help="the checkout measured against it")
    parser.add_argument("--model", required=True, help="a tiny model directory (2-layer Llama)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--max-load", type=float, default=1.2,
                        help="wait before a pair while the 1-minute load average is above this")
    parser.add_argument("--max-wait", type=float, default=600.0,
                        help="the longest wait for it, in seconds (then the pair runs anyway)")
    parser.add_argument("--out", default=None)
    # Everything after `--` is bench throughput's (argparse would not take `--load-format ...`
    # as a positional list once the options have been read).
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    extra = argv[cut + 1:]
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    # Both sides read the same model, wherever their checkout is.
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    started_load = os.getloadavg()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    waits = []
    for pair in range(args.pairs):
        waits.append(wait_for_quiet(args.max_load, args.max_wait))
        for side in (("a", "b") if pair % 2 == 0 else ("b", "a")):
            runs[side].append(run_side(getattr(args, side), model, extra))
        a, b = runs["a"][-1], runs["b"][-1]
        print(f"pair {pair}: A {a['host_s_per_step'] * 1e3:.3f} ms/step, B {b['host_s_per_step'] * 1e3:.3f} "
              f"(load {waits[-1]['load_average'][0]:.2f} at the start, {os.getloadavg()[0]:.2f} now)",
              flush=True)
    ratios = [a["host_s_per_step"] / b["host_s_per_step"] for a, b in zip(runs["a"], runs["b"])]
    figure = {"benchmark": "host_work_ab", "command": "python " + " ".join(sys.argv),
              "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": {"python": platform.python_version(), "platform": platform.platform(),
                              "cpu_count": os.cpu_count(), "load_average_start": started_load,
                              "load_average_end": os.getloadavg(), "max_load": args.max_load},
              "model": args.model, "workload": WORKLOAD + extra, "a": str(args.a), "b": str(args.b),
              "definition": "host work per step = (elapsed - model_and_sampling) / steps of the timed "
                            "run: schedule, prepare, update, the front-end and the caller's loop",
              "waits": waits, "runs": runs, "paired_ratios": ratios, "ratio": statistics.median(ratios),
              "a_median_host_s_per_step": statistics.median(r["host_s_per_step"] for r in runs["a"]),
              "b_median_host_s_per_step": statistics.median(r["host_s_per_step"] for r in runs["b"])}
    for side in ("a", "b"):
        if all(r["host_work_per_step_s"] for r in runs[side]):
            figure[f"{side}_median_host_phases_s_per_step"] = {
                phase: statistics.median(r["host_work_per_step_s"][phase] for r in runs[side])
                for phase in runs[side][0]["host_work_per_step_s"]}
    print(f"host work per step, A / B: median {figure['ratio']:.2f}x over {len(ratios)} pairs "
          f"({min(ratios):.2f}-{max(ratios):.2f}); A {figure['a_median_host_s_per_step'] * 1e3:.3f} ms, "
          f"B {figure['b_median_host_s_per_step'] * 1e3:.3f} ms")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figure, indent=2) + "\n")


if __name__ == "__main__":
    main()
