"""CUDA-graph decode on a real GPU: the same greedy tokens as eager, and the decode speed-up.

    python benchmarks/check_cuda_graphs.py --out benchmarks/results/cuda_graphs_<gpu>.json

1. Correctness: the bundled demo model, greedy, 8 prompts x 64 tokens, graphs vs
   `enforce_eager=True`; every token must match.
2. Speed: the Qwen3-0.6B config with dummy bf16 weights, decode-heavy batches of 1, 8 and
   64 requests (16-token prompts, 256 new tokens), output tokens/s with graphs and eager
   in the same run, and their ratio.

Exit status 1 when graphs were not captured or tokens differ, 2 without CUDA.
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch

from kvdeck import LLM, SamplingParams
from kvdeck.app.bench.result import build_result, write_json_atomic

REPO = Path(__file__).resolve().parents[1]

QWEN3_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"
GPU_MEMORY_UTILIZATION = 0.4  # two engines are built one after the other


def greedy_tokens(enforce_eager: bool, prompts: list[list[int]]) -> tuple[list[list[int]], bool]:
    # `with`: the engine's memory is freed on leaving, so the next engine profiles a free card.
    with LLM(enforce_eager=enforce_eager, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, seed=0) as llm:
        captured = llm.engine.info.cuda_graphs
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, detokenize=False)
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    return tokens, captured


def decode_throughput(enforce_eager: bool, batch_sizes: list[int]) -> dict[int, float]:
    with LLM(str(QWEN3_CONFIG), load_format="dummy", dtype="bfloat16", enforce_eager=enforce_eager,
             gpu_memory_utilization=GPU_MEMORY_UTILIZATION, seed=0) as llm:
        return _decode_throughput(llm, "eager" if enforce_eager else "graphs", batch_sizes)


def _decode_throughput(llm: LLM, label: str, batch_sizes: list[int]) -> dict[int, float]:
    rng = random.Random(0)
    vocab = llm.engine.info.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True, detokenize=False)
    figures = {}
    for batch in batch_sizes:
        prompts = [[rng.randrange(vocab) for _ in range(16)] for _ in range(batch)]
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, detokenize=False))  # warm-up
        torch.cuda.synchronize()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        figures[batch] = sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed
        print(f"  {label} batch {batch:3d}: {figures[batch]:9.1f} tok/s")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--batch-sizes", default="1,8,64")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA graphs need a CUDA GPU", file=sys.stderr)
        return 2
    rng = random.Random(1)
    prompts = [[rng.randrange(4096) for _ in range(rng.randint(8, 200))] for _ in range(8)]
    with_graphs, captured = greedy_tokens(False, prompts)
    eager, _ = greedy_tokens(True, prompts)
    matching = sum(a == b for a, b in zip(with_graphs, eager))
    print(f"graphs captured: {captured}; greedy sequences equal to eager: {matching}/{len(prompts)}")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    graph_speed = decode_throughput(False, batch_sizes)
    eager_speed = decode_throughput(True, batch_sizes)
    figures = {
        "graphs_captured": captured,
        "greedy_sequences_equal": matching,
        "greedy_sequences": len(prompts),
        "decode_tokens_per_s": {
            str(b): {"graphs": graph_speed[b], "eager": eager_speed[b],
                     "ratio": graph_speed[b] / eager_speed[b]} for b in batch_sizes
        },
    }
    config = {"correctness_model": "demo", "speed_model": str(QWEN3_CONFIG.relative_to(REPO)),
              "speed_dtype": "bfloat16", "prompt_tokens": 16, "output_tokens": 256}
    if args.out:
        write_json_atomic(Path(args.out), build_result("cuda_graphs", config, figures))
        print(f"wrote {args.out}")
    return 0 if captured and matching == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
