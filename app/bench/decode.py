"""`kvdeck bench decode`: one sequence's decode speed against the memory-bandwidth roofline.

A decode step of a single sequence has to read every weight once and the sequence's K/V
so far, and does little arithmetic per byte, so its floor is those bytes divided by the
memory bandwidth. The bandwidth is measured in the same run by a large device-to-device
copy (bytes read plus bytes written over the time, as STREAM and the CUDA samples count
it), and the result is the fraction of that floor the engine reaches:
roofline time per token / measured time per token.
"""

import statistics
import time

import torch

from kvdeck.engine.api.llm import LLM
from kvdeck.engine.types.sampling_params import SamplingParams

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


def time_per_output_token(llm: LLM, prompt: list[int], output_len: int) -> float:
    """Seconds between output tokens of one request (its first token, the prefill's, excluded)."""
    llm.engine.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([prompt], params)
    metrics = out.metrics
    return (metrics.last_token_time - metrics.first_token_time) / (len(out.outputs[0].token_ids) - 1)


def run_decode_benchmark(llm: LLM, prompt: list[int], output_len: int, repeats: int) -> dict:
    if output_len < 2:
        raise ValueError(f"--output-len must be at least 2 (a decode interval), got {output_len}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    time_per_output_token(llm, prompt, min(output_len, 8))  # warm-up: lazy kernels, allocator
    runs = [time_per_output_token(llm, prompt, output_len) for _ in range(repeats)]
    tpot = statistics.median(runs)
    info = llm.engine.info
    bandwidth = copy_bandwidth(torch.device(info.device))
    weights = info.weight_bytes_per_token
    kv_per_token = info.kv_bytes_per_token
    # Output token t + 1 attends to len(prompt) + t tokens: on average len(prompt) + output_len / 2.
    mean_context = len(prompt) + output_len / 2
    bytes_per_token = weights + kv_per_token * mean_context
    roofline_tpot = bytes_per_token / bandwidth
    return {
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
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
