"""An INT4 model against its dense self in the engine, on the CPU, in one process, in turns:
batch-1 decode (one prompt, greedy, a fixed number of new tokens: decode tokens per second
after the first token, as `kvdeck bench decode` times it) and a batch of concurrent requests
(offline `generate` of N prompts at once: output tokens per second, prefills included).

    python benchmarks/bench_cpu_int4_engine.py --int4 INT4_DIR --dense DENSE_DIR \
        --out benchmarks/results/cpu_int4_engine_smollm2.json

Prompts are random token ids (the same for both models); a pair runs the two models one
after the other, the order alternating. The machine's load average is in the JSON.
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
    parser.add_argument("--int4", required=True)
    parser.add_argument("--dense", required=True)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64, help="concurrent requests of the batch figure")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck import LLM, SamplingParams
    from kvdeck.app.bench.result import build_result, write_json_atomic

    load_before = os.getloadavg()
    models = {"int4": LLM(args.int4, max_num_seqs=args.batch, kv_cache_memory_gib=1.0),
              "dense": LLM(args.dense, max_num_seqs=args.batch, kv_cache_memory_gib=1.0)}
    vocab = min(llm.get_tokenizer().vocab_size for llm in models.values())
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)

    def prompts(count: int) -> list[list[int]]:
        return [[rng.randrange(100, vocab) for _ in range(args.input_len)] for _ in range(count)]

    def tok_per_s(llm, batch: list[list[int]]) -> float:
        started = time.perf_counter()
        outputs = llm.generate(batch, params)
        elapsed = time.perf_counter() - started
        if len(batch) == 1:  # decode alone: the tokens after the first, over the time after it
            metrics = outputs[0].metrics
            return (args.output_len - 1) / (metrics.last_token_time - metrics.first_token_time)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed

    for llm in models.values():  # warm: kernels built, pools touched
        tok_per_s(llm, prompts(1))
    figures = {}
    for name, count in (("batch1", 1), (f"batch{args.batch}", args.batch)):
        runs = {"int4": [], "dense": []}
        for pair in range(args.pairs):
            batch = prompts(count)  # fresh prompts each pair: no prefix cache across pairs
            order = ("int4", "dense") if pair % 2 == 0 else ("dense", "int4")
            for model in order:
                runs[model].append(tok_per_s(models[model], batch))
        ratios = [a / b for a, b in zip(runs["int4"], runs["dense"])]
        figures[name] = {"output_tok_per_s": runs, "int4_over_dense_per_pair": ratios,
                         "int4_over_dense_median": statistics.median(ratios)}
        print(f"{name}: int4 {statistics.median(runs['int4']):.1f} tok/s, dense "
              f"{statistics.median(runs['dense']):.1f} tok/s: {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    runners = {name: llm.engine.core.runner for name, llm in models.items()}
    config = {"int4": args.int4, "dense": args.dense, "input_len": args.input_len,
              "output_len": args.output_len, "batch": args.batch, "pairs": args.pairs,
              "dtypes": {name: str(runner.dtype).split(".")[-1] for name, runner in runners.items()},
              "output_heads": {name: type(runner.model.lm_head).__name__ for name, runner in runners.items()},
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("cpu_int4_engine", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
