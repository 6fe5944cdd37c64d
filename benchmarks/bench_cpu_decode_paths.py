"""Batch-1 decode on CPU, path against path in one process: eager fp32 (the exact one) and
the opt-in paths (`compile_decode`, bf16, int8 weight-only), each built once, then timed in
turns, round after round, so that load that comes and goes slows every path of a round
alike. Each path's figure is its ratio to eager fp32 within the same round (> 1: faster).

    python benchmarks/bench_cpu_decode_paths.py --rounds 5 \\
        --out benchmarks/results/cpu_decode_paths_demo.json

The first decode of a compiled path compiles its batch-1 graph (untimed warm-up). The load
average is recorded before and after each round: on a shared machine, read the ratios of
quiet rounds first.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PATHS = {
    "eager_fp32": {},
    "compiled_fp32": {"compile_decode": True},
    "eager_bf16": {"dtype": "bfloat16"},
    "compiled_bf16": {"dtype": "bfloat16", "compile_decode": True},
    "eager_int8": {"quantization": "int8"},
    "compiled_int8": {"quantization": "int8", "compile_decode": True},
}
REFERENCE = "eager_fp32"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from {list(PATHS)}")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from kvdeck import LLM
    from kvdeck.app.bench.decode import timed_decode
    from kvdeck.app.bench.pairs import common_prefix, ratio_summary

    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.paths.split(",")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    llms, warmup_s = {}, {}
    for name in names:
        llms[name] = LLM(args.model, max_num_seqs=1, max_model_len=args.input_len + args.output_len,
                         kv_cache_memory_gib=0.05, **PATHS[name])
    rng = random.Random(0)
    prompt = [rng.randrange(llms[REFERENCE].engine.info.vocab_size) for _ in range(args.input_len)]
    for name in names:
        started = time.perf_counter()
        timed_decode(llms[name], prompt, 8)  # compiles the batch-1 graph of a compiled path
        warmup_s[name] = time.perf_counter() - started
    runs: dict[str, list[float]] = {name: [] for name in names}
    tokens: dict[str, list[int]] = {}
    loads = []
    for index in range(args.rounds):
        load_before = os.getloadavg()[0]
        for name in names if index % 2 == 0 else names[::-1]:  # who goes first alternates
            tpot, tokens[name] = timed_decode(llms[name], prompt, args.output_len)
            runs[name].append(tpot)
        loads.append((load_before, os.getloadavg()[0]))
        print(f"round {index} load {loads[-1][0]:.2f}->{loads[-1][1]:.2f}: "
              + "  ".join(f"{n} {runs[n][-1] * 1e3:.2f}" for n in names) + " ms/token", flush=True)
    figures = {}
    for name in names:
        ratios = [ref / mine for ref, mine in zip(runs[REFERENCE], runs[name])]
        figures[name] = {
            "engine_options": PATHS[name],
            "time_per_output_token_s": statistics.median(runs[name]),
            "runs_time_per_output_token_s": runs[name],
            "speedup_vs_eager_fp32": ratio_summary(ratios),
            "greedy_tokens_in_common_with_eager_fp32": common_prefix(tokens[name], tokens[REFERENCE]),
            "warmup_s": warmup_s[name],
        }
        print(f"{name:15s} {figures[name]['time_per_output_token_s'] * 1e3:7.2f} ms/token  "
              f"x{figures[name]['speedup_vs_eager_fp32']['median']:.2f} vs eager fp32 "
              f"(rounds {min(ratios):.2f}-{max(ratios):.2f}); same greedy tokens: "
              f"{figures[name]['greedy_tokens_in_common_with_eager_fp32']}/{args.output_len}")
    if args.out:
        from kvdeck.app.bench.result import build_result, write_json_atomic

        config = {key: value for key, value in vars(args).items() if key != "out"}
        config["torch_threads"] = torch.get_num_threads()
        config["load_average_1min_per_round"] = loads
        write_json_atomic(Path(args.out), build_result("cpu_decode_paths", config, {"paths": figures}))
        print(json.dumps({"written": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
