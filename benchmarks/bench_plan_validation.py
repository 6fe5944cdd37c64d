"""`kvdeck plan` against a recorded CPU session (the target: TTFT p50 and ITL p50
within 20%, peak KV blocks exact). The demo model serves a seeded synthetic workload in its
own process (AsyncLLM, as `kvdeck --serve` runs it), recorded as `--record` records it
(SessionRecorder + record_engine); then the planner replays the recording with a step-cost
model fitted to the recording's own steps, and its comparison table is the result.

    python benchmarks/bench_plan_validation.py --out benchmarks/results/plan_validation_cpu.json

(Two scenarios, SCENARIOS below; the machine's load average before and after each is kept.)
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from kvdeck.app.plan.planner import PlanOptions, plan  # noqa: E402
from kvdeck.app.plan.workload import Lengths, SyntheticWorkload  # noqa: E402
from kvdeck.app.record.session import SessionRecorder, record_engine  # noqa: E402
from kvdeck.engine.api.async_llm import AsyncLLM  # noqa: E402
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402


async def record_session(path: Path, args: argparse.Namespace) -> None:
    client = AsyncLLM(None, num_gpu_blocks_override=args.num_blocks, max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens)
    await client.start()
    recorder = SessionRecorder(path)
    task = asyncio.create_task(record_engine(client, recorder, "demo"))
    workload = SyntheticWorkload(
        users=args.users, prompt_len=Lengths.parse(args.prompt_len, "prompt"),
        output_len=Lengths.parse(args.output_len, "output"), vocab_size=client.vocab_size,
        max_model_len=client.max_model_len, shared_prefix=args.shared_prefix, rate=args.rate,
        seed=args.seed)
    start = time.perf_counter()

    async def one(request) -> None:
        await asyncio.sleep(max(0.0, request.arrival_s - (time.perf_counter() - start)))
        params = SamplingParams(max_tokens=request.output_len, ignore_eos=True, temperature=0.0,
                                detokenize=False, output_kind=RequestOutputKind.DELTA)
        async for _ in client.generate(request.prompt_token_ids, params, request.request_id):
            pass

    try:
        await asyncio.gather(*(one(r) for r in workload.initial()))
        await asyncio.sleep(1.5)  # the last snapshots reach the recording
    finally:
        task.cancel()
        recorder.close()
        await client.shutdown()


# Two loads on the demo model: below the knee (the pool never fills: TTFT is a prefill step
# and a little queueing) and at it (the pool fills, requests are preempted and queue, and a
# few percent of step time more or less moves TTFT a lot: the planner's hardest case).
SCENARIOS = {"steady": {"rate": 3.0, "num_blocks": 160}, "saturated": {"rate": 6.0, "num_blocks": 96}}


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    scenario = argparse.Namespace(**(vars(args) | SCENARIOS[name]))
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / f"{name}.kvrec"
        load_before = os.getloadavg()
        asyncio.run(record_session(path, scenario))
        report = plan(PlanOptions(recording=str(path)))
    print(f"{name}: rate {scenario.rate}/s, {scenario.num_blocks} blocks")
    for c in report.comparisons:
        error = "-" if c.error is None else f"{c.error:+.1%}"
        print(f"  {c.name:16} recorded {c.recorded!s:>22} predicted {c.predicted!s:>22} error "
              f"{error:>7} {'' if c.ok is None else ('ok' if c.ok else 'MISS')}")
    print("  " + report.summaries[0].cost_model)
    return {"rate": scenario.rate, "num_blocks": scenario.num_blocks,
            "comparisons": report.to_json()["comparisons"], "notes": report.notes,
            "cost_model": report.summaries[0].cost_model,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/plan_validation_cpu.json")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both")
    parser.add_argument("--keep", type=Path, help="a folder to keep the recordings in")
    parser.add_argument("--users", type=int, default=48)
    parser.add_argument("--prompt-len", default="64-320")
    parser.add_argument("--output-len", default="32-128")
    parser.add_argument("--shared-prefix", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = list(SCENARIOS) if args.scenario == "both" else [args.scenario]
    figures = {name: run_scenario(name, args) for name in names}
    write_json_atomic(args.out, build_result("plan_validation", vars(args) | {
        "out": str(args.out), "keep": str(args.keep) if args.keep else None},
                                             {"scenarios": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
