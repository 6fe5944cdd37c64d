"""KV cache dtypes side by side on one model, on CPU: KV capacity (tokens per GiB), perplexity
on held-out text scored through the paged cache, greedy agreement with the 32-bit cache
over 128 tokens, and batch-1 decode speed.

    python benchmarks/quality_kv_cache.py --out benchmarks/results/quality_kv_cache_demo.json
    python benchmarks/quality_kv_cache.py --model smollm2 --max-windows 8 \
        --out benchmarks/results/quality_kv_cache_smollm2.json

Perplexity: exp(mean next-token NLL) over non-overlapping windows of --seq-len tokens, each
window one prefill whose every query reads its keys and values back from the cache
(`engine/runner/scoring.py`). Agreement: for each prompt, the share of the 128 greedy tokens
before the first that differs from the 32-bit cache's, averaged.
"""

import argparse
import time
from pathlib import Path

import torch

from kvdeck import LLM, SamplingParams
from kvdeck.app.bench.result import build_result, write_json_atomic
from kvdeck.engine.runner.scoring import sequence_logits
from kvdeck.engine.types.model_path import demo_model_dir

DTYPES = ("auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")
PROMPTS = ["Return a", "The json module", "def open(file, mode='r'):\n    \"\"\"",
           "Read the file and", "class Path:", "import os\n", "Parse the arguments",
           "The quick brown fox"]
NUM_TOKENS = 128
POOL_GIB = 0.25


def resolve(model: str) -> tuple[str, Path]:
    if model == "demo":
        return str(demo_model_dir()), demo_model_dir() / "heldout.txt"
    if model == "smollm2":
        from kvdeck.app.cli.default_model import default_model

        directory = default_model(None)
        if directory is None:
            raise SystemExit("quality_kv_cache: SmolLM2-135M-Instruct could not be fetched")
        return directory, demo_model_dir() / "heldout.txt"
    return model, demo_model_dir() / "heldout.txt"


def perplexity(llm: LLM, ids: list[int], seq_len: int, max_windows: int) -> tuple[float, int]:
    runner = llm.engine.core.runner
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, seq_len)[:max_windows]:
        window = ids[start:start + seq_len]
        if len(window) < 2:
            break
        logits = sequence_logits(runner, window)[:-1]
        target = torch.tensor(window[1:], device=logits.device)
        total += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        count += len(window) - 1
    return float(torch.tensor(total / count).exp()), count


def agreement(got: list[list[int]], reference: list[list[int]]) -> float:
    prefixes = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), NUM_TOKENS)
                for x, y in zip(got, reference)]
    return sum(prefixes) / (NUM_TOKENS * len(prefixes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="demo | smollm2 | a model folder")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model_dir, text_path = resolve(args.model)
    figures: dict[str, dict] = {}
    reference: list[list[int]] = []
    for kv_dtype in DTYPES:
        llm = LLM(model_dir, device="cpu", dtype="float32", kv_cache_memory_gib=POOL_GIB,
                  kv_cache_dtype=kv_dtype)
        runner, tok = llm.engine.core.runner, llm.get_tokenizer()
        ids = tok.encode(text_path.read_text(encoding="utf-8"), add_special_tokens=False)
        ppl, scored = perplexity(llm, ids, args.seq_len, args.max_windows)
        params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
        outputs = llm.generate([tok.encode(p) for p in PROMPTS], params)
        tokens = [o.outputs[0].token_ids for o in outputs]
        reference = reference or tokens
        started = time.perf_counter()
        llm.generate([tok.encode(PROMPTS[0])], params)
        decode_s = time.perf_counter() - started
        stored = runner.kv_pool.format.name
        figures[stored] = {
            "kv_cache_dtype": kv_dtype, "bytes_per_block": runner.bytes_per_block,
            "tokens_per_gib": (2**30 // runner.bytes_per_block) * runner.block_size,
            "perplexity": ppl, "scored_tokens": scored,
            "greedy_agreement_128": agreement(tokens, reference),
            "decode_tok_per_s_batch1": NUM_TOKENS / decode_s,
        }
        print(f"{stored:>9}: {figures[stored]['tokens_per_gib']:>9,} tok/GiB  ppl {ppl:8.3f}  "
              f"agreement {figures[stored]['greedy_agreement_128']:.3f}  "
              f"{figures[stored]['decode_tok_per_s_batch1']:.1f} tok/s")
        del llm
    if args.out:
        config = {"model": args.model, "model_dir": str(model_dir), "held_out": str(text_path),
                  "seq_len": args.seq_len, "max_windows": args.max_windows,
                  "agreement_prompts": len(PROMPTS), "agreement_tokens": NUM_TOKENS,
                  "device": "cpu", "threads": torch.get_num_threads(),
                  "block_size": 16, "reference": "the 32-bit cache (weights and cache in float32)"}
        write_json_atomic(Path(args.out), build_result("quality_kv_cache", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
