"""What recording costs the engine: output throughput of 64 concurrent streams on one
engine client with nothing recording against the same load while a recording runs as
`kvdeck --serve --record` records (a task reading every stats snapshot, the output and step
listeners, the writer thread). Rounds alternate the two sides on the same engine and
repeat; each round's ratio is in the JSON, the median is the figure. Each side also
measures the CPU both processes spent (the front-end's from /proc/self, the engine's from
its child process), so the recorder's added CPU as a share of it is a figure that a shared
machine's load swings far less than the wall-clock ratio. The recorded sides' files give
the size of a busy session, extrapolated to ten minutes. Linux (/proc).

    python benchmarks/bench_record_cost.py --rounds 11 --out benchmarks/results/record_cost_cpu.json

The engine runs the bundled demo model (--model for another) with its default CPU pool
(1 GiB: 10,922 blocks of 16, so every snapshot carries a 10,922-entry block map).
"""

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from kvdeck.app.record.reader import open_recording  # noqa: E402
from kvdeck.app.record.session import SNAPSHOT_HZ, SessionRecorder, record_engine  # noqa: E402
from kvdeck.engine.api.async_llm import AsyncLLM  # noqa: E402
from kvdeck.engine.types.sampling_params import SamplingParams  # noqa: E402


def _cpu_s(pid: int | str) -> float:
    """A process's user + system CPU seconds, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """The engine's CPU: every live child process of this one (the engine core)."""
    total, me = 0.0, str(os.getpid())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    total += _cpu_s(entry.name)
            except (OSError, IndexError):
                pass  # gone meanwhile
    return total


async def one_side(client: AsyncLLM, requests: int, concurrency: int, prompt_tokens: int,
                   max_tokens: int, record_to: Path | None, seed: int, snapshot_hz: float) -> dict:
    recorder = task = None
    if record_to is not None:
        recorder = SessionRecorder(record_to, snapshot_hz=snapshot_hz)
        task = asyncio.create_task(record_engine(client, recorder, client.model_name))
        await asyncio.sleep(0.2)  # listening before the load starts, as a server would be
    queue = list(range(requests))
    tokens = 0
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    vocab = client.vocab_size

    async def worker() -> None:
        nonlocal tokens
        while queue:
            n = queue.pop()
            prompt = [(seed * 7919 + n * 131 + i * 17) % (vocab - 10) + 5
                      for i in range(prompt_tokens)]  # distinct prompts: no prefix hits
            async for out in client.generate(prompt, params):
                if out.finished:
                    tokens += sum(len(choice.token_ids) for choice in out.outputs)

    start, main_cpu = time.perf_counter(), time.thread_time()
    front_cpu, engine_cpu = _cpu_s("self"), _children_cpu_s()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    # The event loop's thread: the recorder's listeners run on it, its writer thread apart.
    # CPU seconds are what the sides cost whatever else the machine runs: the recorder's
    # extra front-end CPU over the CPU both processes spent is the share of the machine's
    # work it adds (the wall-clock ratio on a shared machine swings by tens of percent).
    side = {"output_tokens_per_s": tokens / elapsed, "seconds": elapsed,
            "event_loop_cpu_s": time.thread_time() - main_cpu,
            "front_end_cpu_s": _cpu_s("self") - front_cpu,
            "engine_cpu_s": _children_cpu_s() - engine_cpu, "load_average": os.getloadavg()}
    if recorder is not None:
        assert task is not None
        task.cancel()
        recorder.close()
        size = record_to.stat().st_size
        with open_recording(record_to) as rec:
            busy_s = rec.end - rec.start
            snapshots = len(rec.snapshot_times())
        side.update({"file_bytes": size, "recorded_s": busy_s, "snapshots": snapshots,
                     "snapshots_per_s": snapshots / busy_s if busy_s else 0.0,
                     "dropped": recorder.counters.dropped,
                     "writer_cpu_s": recorder.counters.thread_cpu_s,
                     "mb_per_10_min": size / busy_s * 600 / 2**20 if busy_s else 0.0})
    return side


async def run(args: argparse.Namespace) -> dict:
    client = AsyncLLM(None if args.model == "demo" else args.model)
    await client.start()
    folder = Path(tempfile.mkdtemp(prefix="kvdeck-record-bench-"))
    try:
        side = lambda recorded, i: one_side(  # noqa: E731
            client, args.requests, args.concurrency, args.prompt_tokens, args.max_tokens,
            folder / f"round-{i}.kvrec" if recorded else None, seed=i, snapshot_hz=args.snapshot_hz)
        await side(False, -1)  # warm-up
        rounds = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            sides = {recorded: await side(recorded, i) for recorded in order}
            ratio = sides[True]["output_tokens_per_s"] / sides[False]["output_tokens_per_s"]
            plain, rec = sides[False], sides[True]  # the same tokens a side
            added = rec["front_end_cpu_s"] - plain["front_end_cpu_s"]
            cpu_share = added / (rec["front_end_cpu_s"] + rec["engine_cpu_s"])
            rounds.append({"plain": plain, "recording": rec, "ratio": ratio,
                           "added_cpu_s": added, "added_cpu_share": cpu_share})
            rec = sides[True]
            print(f"round {i}: plain {sides[False]['output_tokens_per_s']:.0f} tok/s, "
                  f"recording {rec['output_tokens_per_s']:.0f} tok/s, ratio {ratio:.3f} "
                  f"({rec['snapshots_per_s']:.1f} snapshots/s, {rec['file_bytes'] / 1024:.0f} KiB "
                  f"for {rec['recorded_s']:.1f} s: {rec['mb_per_10_min']:.1f} MB / 10 min, "
                  f"writer thread {rec['writer_cpu_s']:.2f} s CPU, event loop "
                  f"{sides[False]['event_loop_cpu_s']:.2f} -> {rec['event_loop_cpu_s']:.2f} s; "
                  f"load {rec['load_average'][0]:.2f}); CPU added {added:.2f} s = "
                  f"{cpu_share:.1%} of the {rec['front_end_cpu_s'] + rec['engine_cpu_s']:.1f} s "
                  "both processes spent",
                  flush=True)
        info = client.info
    finally:
        await client.shutdown()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    ratios = [r["ratio"] for r in rounds]
    shares = [r["added_cpu_share"] for r in rounds]
    sizes = [r["recording"]["mb_per_10_min"] for r in rounds]
    return {"recording_over_plain_median": statistics.median(ratios),
            "cost_percent_median": (1 - statistics.median(ratios)) * 100,
            "ratios": ratios, "mb_per_10_busy_minutes_median": statistics.median(sizes),
            "added_cpu_share_median": statistics.median(shares), "added_cpu_shares": shares,
            "writer_cpu_s_median": statistics.median(r["recording"]["writer_cpu_s"] for r in rounds),
            "num_blocks": info.num_blocks if info else None, "rounds": rounds,
            "load_average": os.getloadavg(),
            "load_average_rounds_min_max": [min(r["recording"]["load_average"][0] for r in rounds),
                                            max(r["recording"]["load_average"][0] for r in rounds)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--snapshot-hz", type=float, default=SNAPSHOT_HZ,
                        help="snapshots the recorder stores a second while busy")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    print(f"median recording / plain throughput: {figures['recording_over_plain_median']:.3f} "
          f"(cost {figures['cost_percent_median']:.1f}%); CPU added: median "
          f"{figures['added_cpu_share_median']:.1%} of both processes' CPU; a busy session records "
          f"{figures['mb_per_10_busy_minutes_median']:.1f} MB per 10 minutes")
    if args.out:
        config = {k: getattr(args, k) for k in ("model", "rounds", "requests", "concurrency",
                                                 "prompt_tokens", "max_tokens", "snapshot_hz")}
        write_json_atomic(args.out, build_result("record_cost", config, figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
