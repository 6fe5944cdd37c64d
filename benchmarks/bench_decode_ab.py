"""Batch-1 decode of two checkouts of kvdeck, in turns: the speed-up of B over A.

Each side runs in a process of its own that imports its checkout's kvdeck (the README's
editable install, pointed at the checkout; `git worktree add /tmp/base HEAD~1` gives the
other side), decodes a 128-token random prompt
greedily and reports its median of 3 timed runs in ms per output token. Sides alternate,
and the first side of each pair alternates too; the figure is the median of the per-pair
ratios A / B. The greedy tokens of the two sides are compared.

    python benchmarks/bench_decode_ab.py /tmp/base . --model demo --pairs 10 \
        --out benchmarks/results/decode_ab.json
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# The start of a side's program (bench_host_ab.py's too): the editable install maps kvdeck's
# folders to the checkout it was installed from; point them at the side's checkout (argv[1]).
CHECKOUT_PRELUDE = """
import importlib, pkgutil, sys
finder = importlib.import_module(next(m.name for m in pkgutil.iter_modules()
                                      if m.name.startswith("__editable___kvdeck_")))
installed = finder.MAPPING["kvdeck"].rsplit("/", 1)[0]
for name, path in list(finder.MAPPING.items()):
    finder.MAPPING[name] = sys.argv[1] + path[len(installed):]
import kvdeck.kernels
"""

SIDE = CHECKOUT_PRELUDE + """
import json, random, time
from kvdeck import LLM, SamplingParams
llm = LLM(sys.argv[2], max_num_seqs=1, kv_cache_memory_gib=0.05)
rng = random.Random(0)
prompt = [rng.randrange(1000, 4000) for _ in range(128)]
out_len = int(sys.argv[3])
params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True, detokenize=False)
tokens = llm.generate([prompt], params)[0].outputs[0].token_ids
runs = []
for _ in range(3):
    started = time.perf_counter()
    llm.generate([prompt], params)
    runs.append((time.perf_counter() - started) / out_len * 1e3)
print(json.dumps({"kernels": kvdeck.kernels.__file__, "ms": sorted(runs)[1], "tokens": list(tokens)}))
"""


def run_side(checkout: Path, model: str, output_len: int) -> dict:
    """One side's run in a fresh process (its kernels built from its own sources)."""
    root = str(checkout.resolve())
    done = subprocess.run([sys.executable, "-c", SIDE, root, model, str(output_len)],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["kernels"].startswith(root + "/"):
        raise RuntimeError(f"side {checkout} imported kvdeck from {result['kernels']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the baseline checkout")
    parser.add_argument("b", type=Path, help="the checkout measured against it")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"a": [], "b": []}
    same_tokens = True
    for pair in range(args.pairs):
        results = {}
        for side in (("a", "b") if pair % 2 == 0 else ("b", "a")):
            results[side] = run_side(getattr(args, side), args.model, args.output_len)
            runs[side].append(results[side]["ms"])
        same_tokens &= results["a"]["tokens"] == results["b"]["tokens"]
        print(f"pair {pair}: A {runs['a'][-1]:.3f} ms/token, B {runs['b'][-1]:.3f}", flush=True)
    ratios = [a / b for a, b in zip(runs["a"], runs["b"])]
    figure = {"benchmark": "decode_ab", "command": "python " + " ".join(sys.argv), "model": args.model,
              "output_len": args.output_len, "a": str(args.a), "b": str(args.b),
              "a_ms_per_token": runs["a"], "b_ms_per_token": runs["b"], "paired_ratios": ratios,
              "ratio": statistics.median(ratios), "greedy_tokens_identical": same_tokens}
    print(f"B over A: {figure['ratio']:.2f}x (median of {len(ratios)} paired ratios, "
          f"{min(ratios):.2f}-{max(ratios):.2f}); greedy tokens identical: {same_tokens}")
    if args.out:
        Path(args.out).write_text(json.dumps(figure, indent=2) + "\n")


if __name__ == "__main__":
    main()
