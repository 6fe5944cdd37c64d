"""`--baseline llama.cpp` for `kvdeck bench decode` and `kvdeck bench throughput`: start
llama-server on the same model (GGUF), give both sides the same prompts in turns, keep each
pair's ratio (kvdeck's tokens/s over llama.cpp's: above 1, kvdeck is faster)."""

import argparse
from collections.abc import Callable

from kvdeck.app.bench.llama_cpp import LlamaServer, complete, run_requests, start_server
from kvdeck.app.bench.pairs import alternate, ratio_summary
from kvdeck.app.bench.throughput import BenchRequest, median_run, run_kvdeck, warmup_requests
from kvdeck.engine.api.llm import LLM


def decode_baseline(args: argparse.Namespace, prompt: list[int], output_len: int, threads: int,
                    kv_type: str) -> tuple[LlamaServer, Callable[[], tuple[float, list[int]]]]:
    """A started server (one slot) and the call that decodes `prompt` on it."""
    server = start_server(args, threads, len(prompt) + output_len, kv_type=kv_type)

    def decode() -> tuple[float, list[int]]:
        run = complete(server.url, prompt, output_len)
        return run.time_per_output_token_s, run.token_ids

    return server, decode


def throughput_pairs(args: argparse.Namespace, llm: LLM, requests: list[BenchRequest],
                     threads: int) -> tuple[dict, list[str]]:
    """kvdeck's engine and llama-server (as many slots as kvdeck runs sequences, each as long
    as the longest request) on the same requests, in turns; the figures and the server's
    command line."""
    info = llm.engine.info
    parallel = min(len(requests), llm.engine.config.max_num_seqs)
    longest = max(len(r.prompt_token_ids) + r.output_len for r in requests)
    with start_server(args, threads, longest, parallel, kv_type=info.kv_cache_dtype) as server:
        run_requests(server.url, warmup_requests(requests), parallel)
        pairs = alternate(lambda: run_kvdeck(llm, requests),
                          lambda: run_requests(server.url, requests, parallel), args.repeats)
        command = server.command
    kvdeck = median_run([k for k, _ in pairs])
    baseline = {"name": "llama.cpp", **median_run([b for _, b in pairs])}
    ratio = ratio_summary([k["output_tokens_per_s"] / b["output_tokens_per_s"] for k, b in pairs])
    return {"kvdeck": kvdeck, "baseline": baseline, "ratio": ratio["median"], "ratio_pairs": ratio}, command
