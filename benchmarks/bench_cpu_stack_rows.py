"""What a bf16 model's decode steps of five to eight rows cost through the native decoder stack
(and the output head's GEMV), which they take so that a speculative verify's rows are a
one-row step's bits, against the Python forward (oneDNN's packed GEMMs, SDPA) that took them
before: the same model loaded twice in one process, one stack taking up to
BF16_STACK_MAX_ROWS rows, the other up to GEMV_MAX_ROWS, each decoding N concurrent
requests (N = 5..8, so every decode step has N rows), in turns.

    python benchmarks/bench_cpu_stack_rows.py --model SMOLLM2_DIR \
        --out benchmarks/results/cpu_bf16_stack_rows.json

Prompts are random token ids, the same for both sides; a pair runs the two one after the
other, the order alternating. Output tokens per second over the whole generate (one short
prefill, then decode). The machine's load average is in the JSON.
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
    parser.add_argument("--rows", default="5,8", help="concurrent requests, each a row of every step")
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck import LLM, SamplingParams
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.kernels.cpu import native as cpu_native

    load_before = os.getloadavg()
    most = max(int(r) for r in args.rows.split(","))
    sides = {}
    for name, limit in (("stack", cpu_native.BF16_STACK_MAX_ROWS), ("python", cpu_native.GEMV_MAX_ROWS)):
        default = cpu_native.BF16_STACK_MAX_ROWS
        cpu_native.BF16_STACK_MAX_ROWS = limit  # read once, as the model binds its stack and head
        try:
            llm = LLM(args.model, dtype="bfloat16", max_num_seqs=most, kv_cache_memory_gib=1.0)
        finally:
            cpu_native.BF16_STACK_MAX_ROWS = default
        model = llm.engine.core.runner.model
        if model.model.decoder_stack is None or model.model.decoder_stack.max_rows != limit:
            print(f"{name}: the model did not bind a decoder stack of {limit} rows")
            return 1
        sides[name] = llm
    vocab = sides["stack"].get_tokenizer().vocab_size
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)

    def tok_per_s(llm, prompts: list[list[int]]) -> float:
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - started)

    for llm in sides.values():  # warm
        tok_per_s(llm, [[rng.randrange(100, vocab) for _ in range(args.input_len)]])
    figures = {}
    for rows in [int(r) for r in args.rows.split(",")]:
        runs = {"stack": [], "python": []}
        for pair in range(args.pairs):
            prompts = [[rng.randrange(100, vocab) for _ in range(args.input_len)] for _ in range(rows)]
            for name in (("stack", "python") if pair % 2 == 0 else ("python", "stack")):
                runs[name].append(tok_per_s(sides[name], prompts))
        ratios = [a / b for a, b in zip(runs["stack"], runs["python"])]
        figures[f"rows{rows}"] = {"output_tok_per_s": runs, "stack_over_python_per_pair": ratios,
                                  "stack_over_python_median": statistics.median(ratios)}
        print(f"{rows} rows: stack {statistics.median(runs['stack']):.1f} tok/s, python forward "
              f"{statistics.median(runs['python']):.1f} tok/s: {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    config = {"model": args.model, "input_len": args.input_len, "output_len": args.output_len,
              "pairs": args.pairs, "stack_max_rows": {"stack": cpu_native.BF16_STACK_MAX_ROWS,
                                                      "python": cpu_native.GEMV_MAX_ROWS},
              "threads": __import__("torch").get_num_threads(),
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("cpu_bf16_stack_rows", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
