"""The prefix cache's disk tier: time to first token of a long conversation resumed
after a restart, with the disk tier against without it.

    python benchmarks/bench_kv_disk_tier.py --model SMOLLM2_DIR \
        --out benchmarks/results/kv_disk_tier_smollm2_cpu.json

A chat of about `--tokens` (3,000) prompt tokens (turns cut from assets/calibration, under the
model's chat template) is served once by an engine with `kv_cache_dir` set, which writes its
full blocks and flushes them when it shuts down. Then, per round, fresh engines ("a restart")
serve the same request, one of each side, in an order that alternates round by round:
- `off`: no disk tier, the whole prompt is prefilled;
- `disk`: the same folder, its files in the page cache (they were just written: a restart of
  kvdeck on the same machine);
- `disk_cold`: the same, with the files dropped from the page cache first
  (posix_fadvise DONTNEED after a sync), so they are read from the device.
Each fresh engine serves one request only: what a user resuming a saved chat after starting
kvdeck sees. TTFT is the request's own (arrival to first token, engine start-up excluded).
Figures: per round each side's TTFT and each disk side's ratio to off, medians, and whether
the first tokens of each side equal off's (greedy). The machine's load average is in the JSON.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def conversation(tokenizer, target_tokens: int) -> list[int]:
    """Prompt token ids of a multi-turn chat of about target_tokens tokens, ending with a user turn."""
    text = (ROOT / "assets" / "calibration" / "calibration.txt").read_text()
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 200]
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, paragraph in enumerate(paragraphs):
        role = "user" if i % 2 == 0 else "assistant"
        content = (f"Summarise this:\n{paragraph}" if role == "user" else paragraph)[:1500]
        candidate = messages + [{"role": role, "content": content}]
        if role == "user":
            text = tokenizer.apply_chat_template(candidate, add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) >= target_tokens:
                return list(ids)
        messages = candidate
    raise SystemExit("the calibration text is too short for that many tokens")


def drop_from_page_cache(folder: Path) -> None:
    os.sync()
    for path in folder.rglob("*.kvb"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check-tokens", type=int, default=8, help="greedy tokens compared between sides")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=0.25)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck import LLM, SamplingParams
    from kvdeck.app.bench.result import build_result, write_json_atomic

    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="kvdeck-disk-tier-"))
    common = {"kv_cache_memory_gib": args.kv_cache_memory_gib, "max_model_len": args.tokens + 512}
    params = SamplingParams(temperature=0.0, max_tokens=args.check_tokens, ignore_eos=True)
    try:
        with LLM(args.model, kv_cache_dir=str(folder), **common) as first:
            prompt = conversation(first.get_tokenizer(), args.tokens)
            first.generate([prompt], params)  # populates the folder; the shutdown flushes it
            info = first.engine.core.info
        files = list(folder.rglob("*.kvb"))
        print(f"{len(prompt)} prompt tokens; {len(files)} blocks on disk "
              f"({sum(f.stat().st_size for f in files) / 2**20:.1f} MiB)", flush=True)

        def serve(side: str) -> tuple[float, list[int], int]:
            tier = {} if side == "off" else {"kv_cache_dir": str(folder)}
            if side == "disk_cold":
                drop_from_page_cache(folder)
            with LLM(args.model, **common, **tier) as llm:  # a restart
                out = llm.generate([prompt], params)[0]
            return out.metrics.time_to_first_token, out.outputs[0].token_ids, out.num_cached_tokens

        sides = ("off", "disk", "disk_cold")
        ttft: dict[str, list[float]] = {side: [] for side in sides}
        cached: dict[str, list[int]] = {side: [] for side in sides}
        same_tokens: dict[str, list[bool]] = {"disk": [], "disk_cold": []}
        for round_ in range(args.rounds):
            order = sides if round_ % 2 == 0 else tuple(reversed(sides))
            tokens = {}
            for side in order:
                seconds, tokens[side], num_cached = serve(side)
                ttft[side].append(seconds)
                cached[side].append(num_cached)
            for side in same_tokens:
                same_tokens[side].append(tokens[side] == tokens["off"])
            print(f"round {round_}: " + ", ".join(f"{s} {ttft[s][-1] * 1000:.0f} ms ({cached[s][-1]} cached)"
                                                  for s in sides), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = {side: [d / o for d, o in zip(ttft[side], ttft["off"], strict=True)] for side in same_tokens}
    medians = {side: statistics.median(r) for side, r in ratios.items()}
    for side, median in medians.items():
        print(f"{side}: TTFT {median:.3f}x of off (median of {args.rounds}; "
              f"{min(ratios[side]):.3f}-{max(ratios[side]):.3f}); first {args.check_tokens} tokens as off's "
              f"in {sum(same_tokens[side])} of {args.rounds}")
    figures = {"ttft_s": ttft, "cached_tokens": cached, "ratio_to_off": ratios,
               "ratio_to_off_median": medians, "target": 0.2,
               "meets_target": {side: m <= 0.2 for side, m in medians.items()},
               "tokens_equal_to_off": same_tokens}
    config = {"model": args.model, "prompt_tokens": len(prompt), "rounds": args.rounds,
              "check_tokens": args.check_tokens, "blocks_on_disk": len(files),
              "block_size": info.block_size, "kv_bytes_per_block": info.kv_bytes_per_block,
              "dtype": info.dtype, "kv_cache_dtype": info.kv_cache_dtype,
              "threads": __import__("torch").get_num_threads(),
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("kv_disk_tier", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
