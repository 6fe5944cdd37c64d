"""`kvdeck bench serve --baseline llama.cpp`: the same Poisson workload against llama-server,
in turns with the server under test.

Identical prompts: `bench serve` draws prompt ids from a pool of ids a tokenizer gave for a
sample text, so the pool here is what both servers' tokenizers give (their `/tokenize`
endpoints differ in field names, see `serve._tokenize`): every prompt is the same token ids
on both sides.
"""

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvdeck.app.bench.llama_cpp import LlamaServer, extra_args, find_bin_dir, repack_args
from kvdeck.app.bench.pairs import alternate, ratio_summary

# The latencies compared, as kvdeck's over llama.cpp's (above 1: kvdeck is slower), and the
# throughput, as kvdeck's over llama.cpp's (above 1: kvdeck is faster).
LATENCY_RATIOS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")

Run = tuple[dict, Any]  # one run's figures and its per-request results


@dataclass(slots=True)
class LlamaCppServeBaseline:
    args: argparse.Namespace
    url: str
    model: str
    server: LlamaServer | None = None

    @classmethod
    def open(cls, args: argparse.Namespace, longest_request: int) -> "LlamaCppServeBaseline":
        """The llama-server at --llama-cpp-url, or one started on --llama-cpp-gguf."""
        from kvdeck.app.bench.serve import _server_info

        server = None
        url = args.llama_cpp_url
        if url is None:
            if not args.llama_cpp_gguf:
                raise ValueError("--baseline llama.cpp needs --llama-cpp-gguf (or --llama-cpp-url of a "
                                 "running llama-server)")
            threads = args.llama_cpp_threads or os.cpu_count() or 1
            server = LlamaServer(find_bin_dir(args.llama_cpp_bin), args.llama_cpp_gguf, threads,
                                 args.llama_cpp_slot_context or longest_request, args.llama_cpp_parallel,
                                 extra_args=repack_args(args) + extra_args(args)).start()
            url = server.url
        model, _ = _server_info(url, {}, None)
        return cls(args, url, model, server)

    def shared_pool(self, pool: list[int]) -> list[int]:
        """The ids both tokenizers gave: each prompt is then the same ids on both sides."""
        from kvdeck.app.bench.serve import _server_info

        _, theirs = _server_info(self.url, {}, self.model)
        shared = sorted(set(pool) & set(theirs))
        if len(shared) < len(pool):
            print(f"bench serve: llama.cpp's tokenizer gave {len(theirs)} ids for the sample text, "
                  f"kvdeck's {len(pool)}; prompts use the {len(shared)} both gave", file=sys.stderr)
        if not shared:
            raise ValueError("the two servers' tokenizers share no token id for the sample text: "
                             "are they serving the same model?")
        return shared

    def compare(self, measure: Callable[[str, str, dict], Run], url: str, model: str,
                headers: dict) -> tuple[dict, Any]:
        """Run the workload on the server under test (`url`) and on llama.cpp in turns; the
        figures (both sides' median run by TPOT p50, every run, each pair's ratios) and the
        median kvdeck run's per-request results."""
        pairs = alternate(lambda: measure(url, model, headers), lambda: measure(self.url, self.model, {}),
                          self.args.repeats)
        kvdeck_runs = [k for k, _ in pairs]
        base_runs = [b for _, b in pairs]
        ratios = {f"{key}_p50": ratio_summary([k[0][key]["p50"] / b[0][key]["p50"] for k, b in pairs])
                  for key in LATENCY_RATIOS}
        ratios["output_tokens_per_s"] = ratio_summary(
            [k[0]["output_tokens_per_s"] / b[0]["output_tokens_per_s"] for k, b in pairs])
        kvdeck, results = _median_run(kvdeck_runs)
        figures = {"kvdeck": kvdeck, "baseline": {"name": "llama.cpp", **_median_run(base_runs)[0]},
                   "runs": [{"kvdeck": k[0], "baseline": b[0]} for k, b in pairs], "ratio": ratios}
        return figures, results

    def config(self) -> dict:
        return {"name": "llama.cpp", "url": self.url, "model": self.model,
                "command": self.server.command if self.server else None}

    def print_ratios(self, figures: dict) -> None:
        base = figures["baseline"]
        print(f"llama.cpp: TTFT p50 {base['ttft_ms']['p50']:.1f} ms, "
              f"TPOT p50 {base['tpot_ms']['p50']:.1f} ms, {base['output_tokens_per_s']:.1f} output tok/s")
        for key, summary in figures["ratio"].items():
            print(f"kvdeck / llama.cpp {key}: median {summary['median']:.2f}x "
                  f"({summary['min']:.2f}-{summary['max']:.2f}, {len(summary['pairs'])} pairs)")

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def _median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda run: run[0]["tpot_ms"]["p50"])[(len(runs) - 1) // 2]
