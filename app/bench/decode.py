"""`kvdeck bench decode`: one sequence's decode speed against the memory-bandwidth roofline.

A decode step of a single sequence has to read every weight once and the sequence's K/V
so far, and does little arithmetic per byte, so its floor is those bytes divided by the
memory bandwidth. The bandwidth is measured in the same run by a large device-to-device
copy (bytes read plus bytes written over the time, as STREAM and the CUDA samples count
it), and the result is the fraction of that floor the engine reaches:
roofline time per token / measured time per token. The copy is far larger than the
last-level cache, so the roofline assumes weights come from DRAM; a model whose weights fit
in that cache (the demo's 23 MB in a 32 MB L3) can beat it, and the JSON says so.

The weight bytes are counted from the loaded model's modules, as a step reads them: every
parameter and buffer once (not the input embedding, of which a step reads one row, unless the
output head reads it; not the rotary table), plus the tiles the CPU's INT4 layers
(kernels/cpu/int4.py) and an INT4 model's int8 output head (kernels/cpu/int8.py) keep outside
their parameters, instead of the dense head weight such a head no longer reads.

With a baseline (llama.cpp's server or llama-bench), both sides decode the same prompt in
turns and each pair's ratio is kept. With `contention` (`--contention N`), every repeat runs
quiet and with N CPUs kept busy by other processes (kvdeck.app.bench.contention); the figures
above come from the quiet runs, and `contention` holds each side's busy/quiet speed.
"""

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kvdeck.app.bench.compiles import timed_without_compiles
from kvdeck.app.bench.pairs import alternate, common_prefix, ratio_summary
from kvdeck.engine.api.llm import LLM
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.kernels.cpu.native import last_level_cache_bytes

if TYPE_CHECKING:
    from kvdeck.app.bench.contention import Contention

# A baseline's decode of the prompt: (seconds per output token, its greedy token ids, or None
# where the baseline gives none: llama-bench).
DecodeRun = tuple[float, list[int] | None]

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}
COPY_REPEATS = 10


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second moved by a large tensor copy (read + write), best of a few."""
    size = COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page before timing
    best = float("inf")
    for _ in range(COPY_REPEATS):
        _synchronize(device)
        started = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size / best


def timed_decode(llm: LLM, prompt: list[int], output_len: int) -> DecodeRun:
    """Seconds between output tokens of one greedy request (its first token, the prefill's,
    excluded), and the tokens."""
    llm.engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([prompt], params)
    metrics = out.metrics
    tokens = list(out.outputs[0].token_ids)
    return (metrics.last_token_time - metrics.first_token_time) / (len(tokens) - 1), tokens


def time_per_output_token(llm: LLM, prompt: list[int], output_len: int) -> float:
    return timed_decode(llm, prompt, output_len)[0]


def run_decode_benchmark(llm: LLM, prompt: list[int], output_len: int, repeats: int,
                         baseline: Callable[[], DecodeRun] | None = None,
                         contention: "Contention | None" = None) -> dict:
    """kvdeck's decode speed against the roofline; with `baseline`, also against it, in turns;
    with `contention`, also with CPUs kept busy by other processes (quiet and busy in turns)."""
    if output_len < 2:
        raise ValueError(f"--output-len must be at least 2 (a decode interval), got {output_len}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    time_per_output_token(llm, prompt, min(output_len, 8))  # warm-up: lazy kernels, allocator
    pairs = busy = None
    if contention is not None:
        sides: dict[str, Callable[[], DecodeRun]] = {"kvdeck": lambda: timed_decode(llm, prompt, output_len)}
        if baseline is not None:
            baseline()  # its warm-up
            sides["baseline"] = baseline
        turns, discarded = timed_without_compiles(llm, lambda: contention.turns(sides, repeats),
                                                  "bench decode")
        runs = [run[0] for run in turns["kvdeck"]["quiet"]]
        if baseline is not None:
            pairs = list(zip(turns["kvdeck"]["quiet"], turns["baseline"]["quiet"], strict=True))
        busy = contention.figures({side: {name: [run[0] for run in side_runs[name]] for name in side_runs}
                                   for side, side_runs in turns.items()})
    elif baseline is None:
        runs, discarded = timed_without_compiles(
            llm, lambda: [time_per_output_token(llm, prompt, output_len) for _ in range(repeats)],
            "bench decode")
    else:
        baseline()  # its warm-up
        pairs, discarded = timed_without_compiles(
            llm, lambda: alternate(lambda: timed_decode(llm, prompt, output_len), baseline, repeats),
            "bench decode")
        runs = [kvdeck[0] for kvdeck, _ in pairs]
    tpot = statistics.median(runs)
    info = llm.engine.info
    bandwidth = copy_bandwidth(torch.device(info.device))
    weights = decode_weight_bytes(llm)
    kv_per_token = info.kv_bytes_per_token
    # Output token t + 1 attends to len(prompt) + t tokens: on average len(prompt) + output_len / 2.
    mean_context = len(prompt) + output_len / 2
    bytes_per_token = weights + kv_per_token * mean_context
    roofline_tpot = bytes_per_token / bandwidth
    cache = last_level_cache_bytes() if info.device == "cpu" else None
    figures = {
        "time_per_output_token_s": tpot,
        "output_tokens_per_s": 1 / tpot,
        "runs_time_per_output_token_s": runs,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_context_token": kv_per_token,
        "mean_context_tokens": mean_context,
        "bytes_per_token": bytes_per_token,
        "roofline_time_per_output_token_s": roofline_tpot,
        "roofline_fraction": roofline_tpot / tpot,
        "roofline_memory": "DRAM: bandwidth of a copy larger than the last-level cache",
        "last_level_cache_bytes": cache,
        "weights_fit_in_last_level_cache": cache is not None and weights <= cache,
        "kernel_compiles": 0,  # in the timed runs (app/bench/compiles.py)
        "runs_discarded_for_compiles": discarded,
    }
    if pairs is not None:
        base_runs = [base[0] for _, base in pairs]
        figures["baseline"] = {"time_per_output_token_s": statistics.median(base_runs),
                               "output_tokens_per_s": 1 / statistics.median(base_runs),
                               "runs_time_per_output_token_s": base_runs}
        # kvdeck's tokens/s over the baseline's, pair by pair (> 1: kvdeck is faster).
        figures["ratio"] = ratio_summary([base[0] / kvdeck[0] for kvdeck, base in pairs])
        kvdeck_tokens, base_tokens = pairs[-1][0][1], pairs[-1][1][1]
        if base_tokens is not None:
            figures["greedy_tokens_in_common"] = common_prefix(kvdeck_tokens, base_tokens)
    if busy is not None:
        figures["contention"] = busy
    return figures


def decode_weight_bytes(llm: LLM) -> int:
    """The weight bytes one decode step reads, as the engine counts them (the INT4 and int8
    tiles included)."""
    return llm.engine.info.weight_bytes_per_token


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
