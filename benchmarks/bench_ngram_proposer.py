"""The n-gram proposer's cost a step (engine/core/spec/ngram.py) against the whole-matrix
lookup it replaced, in the same run.

The whole-matrix lookup compared the batch's token matrix with each request's suffix once
per n (a full-width shift, compare and reduction per offset); the proposer now finds the
positions holding each request's last token first (the candidates, few in real text) and
compares only the tokens before them. Both run on the same requests, in turns; each step a
request gains one token, as in decoding. The ratio is per round, whole-matrix / candidates.

    python benchmarks/bench_ngram_proposer.py --out benchmarks/results/ngram_proposer_cpu.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvdeck.engine.core.request import Request  # noqa: E402
from kvdeck.engine.core.spec.ngram import _PAD, NgramProposer  # noqa: E402
from kvdeck.engine.types.sampling_params import SamplingParams  # noqa: E402


class WholeMatrixProposer(NgramProposer):
    """The lookup before the candidates: one pass over the whole matrix per offset."""

    def _match_ends(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        rows = np.arange(len(tokens))
        width = tokens.shape[1]
        matching = np.arange(width)[None, :] < (lengths - 1)[:, None]
        best = np.full(len(tokens), -1)
        for back in range(min(self.max_n, width)):
            wanted = tokens[rows, np.maximum(lengths - 1 - back, 0)]
            shifted = np.full_like(tokens, _PAD)
            shifted[:, back:] = tokens[:, : width - back]
            matching &= (shifted == wanted[:, None]) & (lengths > back)[:, None]
            if back + 1 < self.min_n:
                continue
            found = matching.any(axis=1)
            latest = width - 1 - np.argmax(matching[:, ::-1], axis=1)
            best = np.where(found, latest, best)
        return best


def requests(batch: int, prompt_len: int, seed: int) -> list[Request]:
    """Prompts drawn from a small vocabulary (text repeats itself: candidates exist)."""
    rng = np.random.default_rng(seed)
    return [Request(str(i), rng.integers(0, 512, prompt_len).tolist(), SamplingParams(), set())
            for i in range(batch)]


def time_steps(proposer: NgramProposer, reqs: list[Request], steps: int, k: int, seed: int) -> float:
    """Median seconds of `propose` over `steps` decode steps (one new token each)."""
    rng = np.random.default_rng(seed)
    proposer.propose(reqs, [k] * len(reqs))
    times = []
    for _ in range(steps):
        for request in reqs:
            request.output_token_ids.append(int(rng.integers(0, 512)))
        started = time.perf_counter()
        proposer.propose(reqs, [k] * len(reqs))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for batch in map(int, args.batch_sizes.split(",")):
        runs: dict[str, list[float]] = {"whole_matrix": [], "candidates": []}
        for r in range(args.rounds):
            sides = ("whole_matrix", "candidates") if r % 2 == 0 else ("candidates", "whole_matrix")
            for side in sides:
                proposer = WholeMatrixProposer(2, 5) if side == "whole_matrix" else NgramProposer(2, 5)
                reqs = requests(batch, args.prompt_len, r)
                runs[side].append(time_steps(proposer, reqs, args.steps, 3, r))
        ratios = [w / c for w, c in zip(runs["whole_matrix"], runs["candidates"])]
        row = {"batch": batch, "whole_matrix_us": statistics.median(runs["whole_matrix"]) * 1e6,
               "candidates_us": statistics.median(runs["candidates"]) * 1e6,
               "ratio": statistics.median(ratios), "paired_ratios": ratios}
        results.append(row)
        print(f"batch {batch:3d}: whole matrix {row['whole_matrix_us']:6.1f} us, candidates "
              f"{row['candidates_us']:6.1f} us a step: {row['ratio']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "ngram_proposer", "command": "python " + " ".join(sys.argv),
            "prompt_len": args.prompt_len, "steps": args.steps, "rounds": args.rounds,
            "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
