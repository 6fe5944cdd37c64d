"""Speculative decoding against the same engine without it, in the same run.

Two engines live side by side (the one asked for, and a copy of its options without
`speculative_config`); each repeat times both on the same requests, alternating which goes
first, so drifts of a shared machine hit both sides alike. The speedup is the median of
the per-repeat ratios (a paired figure), beside the ratio of the medians; acceptance comes
from the speculating engine's own counters over the timed runs. Greedy outputs of the two
sides must be equal, and the JSON says whether they were.
"""

import statistics

from kvdeck.engine.api.llm import LLM
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.spec_stats import SpecDecodeStats


def without_speculation(engine_kwargs: dict) -> dict:
    return {k: v for k, v in engine_kwargs.items() if k != "speculative_config"}


def decode_once(llm: LLM, prompt: list[int], output_len: int) -> tuple[float, list[int]]:
    """Seconds per output token of one greedy request (the prefill's token excluded), and its tokens."""
    llm.engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([prompt], params)
    tokens = out.outputs[0].token_ids
    return (out.metrics.last_token_time - out.metrics.first_token_time) / (len(tokens) - 1), tokens


def compare_decode(plain: LLM, spec: LLM, prompts: list[list[int]], output_len: int, repeats: int) -> dict:
    """Batch-1 decode, repeat r on prompts[r % len(prompts)]: time per output token each side."""
    for llm in (plain, spec):
        decode_once(llm, prompts[0], min(output_len, 16))  # warm-up: allocator, lazy kernels
    before = spec.stats().spec
    runs: dict[str, list[float]] = {"plain": [], "spec": []}
    identical = True
    for r in range(repeats):
        prompt = prompts[r % len(prompts)]
        tokens = {}
        for side in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            tpot, tokens[side] = decode_once(plain if side == "plain" else spec, prompt, output_len)
            runs[side].append(tpot)
        identical &= tokens["plain"] == tokens["spec"]
    ratios = [p / s for p, s in zip(runs["plain"], runs["spec"])]
    return {
        "baseline": {"name": "kvdeck without speculative decoding",
                     "time_per_output_token_s": statistics.median(runs["plain"]),
                     "runs_time_per_output_token_s": runs["plain"]},
        "speculative": {"time_per_output_token_s": statistics.median(runs["spec"]),
                        "runs_time_per_output_token_s": runs["spec"]},
        "ratio": statistics.median(ratios),
        "paired_ratios": ratios,
        "ratio_of_medians": statistics.median(runs["plain"]) / statistics.median(runs["spec"]),
        "acceptance": acceptance(before, spec.stats().spec),
        "greedy_outputs_identical": identical,
    }


def compare_throughput(plain: LLM, spec: LLM, requests: list, repeats: int, run_kvdeck, median_run) -> dict:
    """The offline workload through both engines, alternating, `repeats` times each."""
    before = spec.stats().spec
    runs: dict[str, list[dict]] = {"plain": [], "spec": []}
    for r in range(repeats):
        for side in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            runs[side].append(run_kvdeck(plain if side == "plain" else spec, requests))
    ratios = [s["output_tokens_per_s"] / p["output_tokens_per_s"]
              for p, s in zip(runs["plain"], runs["spec"])]
    base, mine = median_run(runs["plain"]), median_run(runs["spec"])
    return {
        "kvdeck": mine,
        "baseline": {"name": "kvdeck without speculative decoding", **base},
        "ratio": statistics.median(ratios),
        "paired_ratios": ratios,
        "ratio_of_medians": mine["output_tokens_per_s"] / base["output_tokens_per_s"],
        "acceptance": acceptance(before, spec.stats().spec),
    }


def acceptance(before: SpecDecodeStats, after: SpecDecodeStats) -> dict:
    """Acceptance over the timed runs (the difference of the engine's counters)."""
    drafts = after.num_drafts - before.num_drafts
    draft_tokens = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    per_pos = [a - b for a, b in zip(after.num_accepted_tokens_per_pos, before.num_accepted_tokens_per_pos)]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_accepted_tokens": accepted / drafts if drafts else 0.0,  # per verification step
        "accepted_rate_per_position": [n / drafts if drafts else 0.0 for n in per_pos],
    }


def print_comparison(kind: str, figures: dict) -> None:
    acc = figures["acceptance"]
    print(f"speculative {kind}: {figures['ratio']:.2f}x (median of paired ratios "
          f"{', '.join(f'{r:.2f}' for r in figures['paired_ratios'])}; ratio of medians "
          f"{figures['ratio_of_medians']:.2f}x)")
    print(f"  acceptance {acc['acceptance_rate']:.1%} of {acc['num_draft_tokens']} draft tokens, "
          f"{acc['mean_accepted_tokens']:.2f} accepted per verification step "
          f"(per position: {', '.join(f'{r:.0%}' for r in acc['accepted_rate_per_position'])})")

