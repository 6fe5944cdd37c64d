"""The cost of constrained decoding on this machine: grammar compile times for the test
schemas, and the time per decode step with every request constrained against the same
run unconstrained, at batch 1 and 64 (alternating, repeated; the ratio is the figure).

    python benchmarks/bench_structured.py --out benchmarks/results/structured_cpu.json

A regex that allows any lowercase text keeps constrained requests running for all their
tokens, so both sides decode the same number of steps; the difference is the bitmask fill
(llguidance, all rows in one parallel call), its application and the matchers' advance.
"""

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.engine's schemas

from kvdeck import LLM, SamplingParams  # noqa: E402
from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from kvdeck.engine.types.structured import StructuredOutputsParams as Spec  # noqa: E402
from tests.engine.test_structured_outputs import specs  # noqa: E402

OPEN_TEXT = Spec(regex="[a-z ]{1,2000}")


def compile_times(llm: LLM) -> dict:
    """Each spec's compile time as the engine reports it (RequestMetrics.grammar_compile_s):
    the first request compiles it, the second finds it cached."""
    one_token = [SamplingParams(max_tokens=1, structured_outputs=spec) for spec, _ in specs()]
    llm.generate(["warm"], SamplingParams(max_tokens=1, structured_outputs=Spec(regex="w")))
    runs = [[out.metrics.grammar_compile_s for out in llm.generate(["x"] * len(one_token), one_token)]
            for _ in range(2)]
    return {"specs": len(runs[0]), "cold_median_s": statistics.median(runs[0]),
            "cold_max_s": max(runs[0]), "cold_s": runs[0], "cached_median_s": statistics.median(runs[1])}


def step_time(llm: LLM, batch: int, constrained: bool, tokens: int) -> float:
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=tokens, ignore_eos=True,
                            structured_outputs=OPEN_TEXT if constrained else None)
    llm.engine.reset_prefix_cache()
    llm.engine.reset_timings()
    llm.generate([f"Write about block {i}:" for i in range(batch)], params)
    timings = llm.engine.step_timings()
    total = timings.schedule_s + timings.prepare_s + timings.model_s + timings.update_s
    return total / timings.steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with LLM(kv_cache_memory_gib=0.25, max_num_seqs=64) as llm:
        compiles = compile_times(llm)
        print(f"compile: {compiles['specs']} specs, median {compiles['cold_median_s'] * 1e3:.1f} ms, "
              f"max {compiles['cold_max_s'] * 1e3:.1f} ms; cached {compiles['cached_median_s'] * 1e6:.0f} us")
        figures: dict = {"compile": compiles}
        for batch in (1, 64):
            step_time(llm, batch, True, 8)  # warm-up
            pairs = []
            for _ in range(args.repeats):  # alternate the two sides, so a slow spell hits both
                free = step_time(llm, batch, False, args.tokens)
                constrained = step_time(llm, batch, True, args.tokens)
                pairs.append((free, constrained))
            ratios = [c / f for f, c in pairs]
            figures[f"batch_{batch}"] = {
                "unconstrained_step_s": statistics.median(f for f, _ in pairs),
                "constrained_step_s": statistics.median(c for _, c in pairs),
                "ratio_median": statistics.median(ratios), "ratios": ratios}
            got = figures[f"batch_{batch}"]
            print(f"batch {batch}: step {got['unconstrained_step_s'] * 1e3:.2f} ms free, "
                  f"{got['constrained_step_s'] * 1e3:.2f} ms constrained; ratio {got['ratio_median']:.3f} "
                  f"(pairs {[f'{r:.3f}' for r in ratios]})")
    if args.out:
        config = {"model": "demo", "tokens": args.tokens, "repeats": args.repeats,
                  "constraint": OPEN_TEXT.regex, "device": "cpu"}
        write_json_atomic(Path(args.out), build_result("structured_outputs", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
