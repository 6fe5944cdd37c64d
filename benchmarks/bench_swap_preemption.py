"""Swap preemption against recompute: a burst of long requests under a KV pool too
small for it, and what one swap costs against recomputing the same tokens.

    python benchmarks/bench_swap_preemption.py --model SMOLLM2_DIR \
        --out benchmarks/results/swap_preemption_smollm2_cpu.json

Burst: the pool is the TUI's default, POOL_FULL_REQUESTS (four) full contexts of
`--context` tokens (tui/engine_factory.py's tui_pool_gib), and `--requests` (16) concurrent
requests of `--prompt-len` random tokens decode `--output-len` tokens each, greedy, so the
pool runs dry and the scheduler preempts. The same model is loaded twice in one process,
preemption_mode="swap" and "recompute"; a pair runs the same prompts on both, the order
alternating, the prefix cache emptied before each run. Figures: each side's burst wall time,
the recompute / swap ratio per pair (above 1: swap is faster) and its median, and per run how
many outputs equal those of a run without preemption (a pool that holds the burst): swap's
must all (the script fails otherwise). Recompute's may not, in bf16: a recomputed prefill's
K/V is not bit for bit the K/V the decode steps wrote, and greedy decoding can part there.

Threshold: for a sequence of L tokens, the runner's swap-out plus swap-in of its blocks
(kv_swap.py, the copies a swap costs) against a prefill of L tokens (what recompute costs),
medians of several; the smallest L where the swap is cheaper is where preemption_mode="auto"
should start swapping (engine/core/swap.py SWAP_MIN_TOKENS). The machine's load average is
in the JSON.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--context", type=int, default=1024, help="max_model_len: a full context")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=192)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--dtype", default="float32",
                        help="float32: batch-invariant on the CPU, so outputs compare exactly; in bfloat16 "
                             "a different batch composition alone changes some greedy outputs")
    parser.add_argument("--threshold-lens", default="8,16,64,256", help="'' to skip the threshold part")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="every side without prefix caching: a recompute then redoes its whole prefix")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    caching = not args.no_prefix_caching

    from kvdeck import LLM, SamplingParams
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.tui.engine_factory import POOL_FULL_REQUESTS, tui_pool_gib

    load_before = os.getloadavg()
    pool_gib = tui_pool_gib(Path(args.model), {"max_model_len": args.context, "dtype": args.dtype})
    sides = {mode: LLM(args.model, max_model_len=args.context, kv_cache_memory_gib=pool_gib,
                       dtype=args.dtype, preemption_mode=mode, enable_prefix_caching=caching)
             for mode in ("swap", "recompute")}
    vocab = sides["swap"].get_tokenizer().vocab_size
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)

    def burst(llm, prompts):
        llm.engine.reset_prefix_cache()
        before = llm.stats()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        wall = time.perf_counter() - started
        after = llm.stats()
        return wall, [o.outputs[0].token_ids for o in outputs], {
            "preemptions": after.num_preemptions - before.num_preemptions,
            "swap_outs": after.swap_outs_total - before.swap_outs_total,
            "swap_out_blocks": after.swap_out_blocks_total - before.swap_out_blocks_total,
            "swap_seconds": after.swap_seconds_total - before.swap_seconds_total}

    for llm in sides.values():  # warm: kernels, allocator
        llm.generate([[rng.randrange(100, vocab) for _ in range(64)]], SamplingParams(max_tokens=4))
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    # The outputs no preemption gives: the same engine settings with a pool that holds them all.
    reference_llm = LLM(args.model, max_model_len=args.context, dtype=args.dtype, preemption_mode="recompute",
                        enable_prefix_caching=caching)
    _, reference, count = burst(reference_llm, prompts)
    reference_llm.shutdown()
    if count["preemptions"]:
        print("the reference run was preempted: give it a bigger pool")
        return 1
    runs = {"swap": [], "recompute": []}
    counts = {"swap": [], "recompute": []}
    unchanged = {"swap": [], "recompute": []}  # per run: requests whose output equals the reference
    ratios = []
    for pair in range(args.pairs):
        for mode in (("swap", "recompute") if pair % 2 == 0 else ("recompute", "swap")):
            wall, outputs, count = burst(sides[mode], prompts)
            runs[mode].append(wall)
            counts[mode].append(count)
            unchanged[mode].append(sum(a == b for a, b in zip(outputs, reference, strict=True)))
            print(f"pair {pair} {mode}: {wall:.2f} s, {unchanged[mode][-1]} of {len(prompts)} outputs "
                  f"as without preemption {count}", flush=True)
        ratios.append(runs["recompute"][-1] / runs["swap"][-1])
    lengths = [int(n) for n in args.threshold_lens.split(",") if n]
    threshold = measure_threshold(sides["swap"], lengths, vocab, rng) if lengths else None
    median = statistics.median(ratios)
    swap_identical = all(n == len(prompts) for n in unchanged["swap"])
    print(f"burst: recompute / swap wall time {median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); "
          f"outputs as without preemption: swap {unchanged['swap']}, recompute {unchanged['recompute']} "
          f"of {len(prompts)}")
    if threshold is not None:
        print(f"swap cheaper than a recompute from {threshold['crossover_tokens']} tokens (as a prefill "
              f"of its own), {threshold['crossover_tokens_marginal']} (as part of a batch)")
    figures = {"burst": {"wall_s": runs, "counts": counts, "recompute_over_swap_per_pair": ratios,
                         "recompute_over_swap_median": median,
                         "outputs_unchanged_per_run": unchanged,
                         "swap_outputs_identical_to_no_preemption": swap_identical},
               "threshold": threshold}
    info = sides["swap"].engine.core.info
    config = {"model": args.model, "context": args.context, "requests": args.requests,
              "prompt_len": args.prompt_len, "output_len": args.output_len, "pairs": args.pairs,
              "enable_prefix_caching": caching,
              "pool": {"full_contexts": POOL_FULL_REQUESTS, "kv_cache_memory_gib": pool_gib,
                       "num_blocks": info.num_blocks, "block_size": info.block_size,
                       "kv_bytes_per_block": info.kv_bytes_per_block},
              "dtype": info.dtype, "threads": __import__("torch").get_num_threads(),
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("swap_preemption", config, figures))
        print(f"wrote {args.out}")
    return 0 if swap_identical else 1


def measure_threshold(llm, lengths: list[int], vocab: int, rng: random.Random, repeats: int = 5) -> dict:
    """Per length L: a swap-out plus swap-in of L tokens' blocks against an L-token prefill."""
    from kvdeck import SamplingParams

    runner = llm.engine.core.runner
    block_size = llm.engine.core.kv_plan.block_size
    swapper = runner.kv_swap
    rows = []
    for length in lengths:
        blocks = list(range(-(-length // block_size)))
        slots = list(range(len(blocks)))
        swaps = []
        for i in range(repeats):
            started = time.perf_counter()
            swapper.copy(-1 - i, [(b, s) for b, s in zip(blocks, slots)], [])
            swapper.copy(-1 - i, [], [(s, b) for b, s in zip(blocks, slots)])
            swaps.append(time.perf_counter() - started)
            swapper.take_times(-1 - i)
        prefills = []
        for _ in range(repeats):
            llm.engine.reset_prefix_cache()
            prompt = [rng.randrange(100, vocab) for _ in range(length)]
            started = time.perf_counter()
            llm.generate([prompt], SamplingParams(max_tokens=1))
            prefills.append(time.perf_counter() - started)
        rows.append({"tokens": length, "swap_out_in_s": statistics.median(swaps),
                     "prefill_s": statistics.median(prefills)})
        print(f"L={length}: swap out+in {rows[-1]['swap_out_in_s'] * 1e3:.2f} ms, prefill "
              f"{rows[-1]['prefill_s'] * 1e3:.2f} ms", flush=True)
    cheaper = [r["tokens"] for r in rows if r["swap_out_in_s"] < r["prefill_s"]]
    # Inside a batch a recompute costs its tokens' share of a step, not a step of its own:
    # the prefill's cost per token beyond the shortest one's, against the whole swap.
    first, last = rows[0], rows[-1]
    per_token = (last["prefill_s"] - first["prefill_s"]) / max(1, last["tokens"] - first["tokens"])
    marginal = [r["tokens"] for r in rows if r["swap_out_in_s"] < per_token * r["tokens"]]
    return {"rows": rows, "crossover_tokens": min(cheaper) if cheaper else None,
            "prefill_s_per_token_in_a_batch": per_token,
            "crossover_tokens_marginal": min(marginal) if marginal else None}


if __name__ == "__main__":
    sys.exit(main())
