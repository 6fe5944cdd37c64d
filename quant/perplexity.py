"""Perplexity of a causal LM on a text file: exp(mean next-token NLL) over
non-overlapping windows of `seq_len` tokens (each window scored from its own start)."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # ids [1, L] -> logits [1, L, vocab]


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    perplexity: float
    num_tokens: int  # predicted tokens
    num_windows: int


def num_windows(num_tokens: int, seq_len: int, max_windows: int | None = None) -> int:
    """How many windows `perplexity` scores for a text of `num_tokens` tokens."""
    count = len([s for s in range(0, max(num_tokens - 1, 0), seq_len) if num_tokens - s >= 2])
    return min(count, max_windows) if max_windows is not None else count


@torch.no_grad()
def perplexity(
    logits_fn: LogitsFn, ids: torch.Tensor, seq_len: int = 512, max_windows: int | None = None,
    on_window: Callable[[int], None] | None = None,
) -> PerplexityResult:
    """`on_window(n)` is called after the n-th window is scored (progress reports)."""
    if ids.dim() != 1:
        raise ValueError("ids must be a 1-D tensor of token ids")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if ids.numel() < 2:
        raise ValueError("need at least 2 tokens of text to measure perplexity")
    total_nll, count, windows = 0.0, 0, 0
    for start in range(0, ids.numel() - 1, seq_len):
        window = ids[start:start + seq_len]
        if window.numel() < 2:
            break
        logits = logits_fn(window[None]).float()[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, window[1:].to(logits.device),
                                                reduction="sum")
        total_nll += nll.item()
        count += window.numel() - 1
        windows += 1
        if on_window is not None:
            on_window(windows)
        if max_windows is not None and windows >= max_windows:
            break
    return PerplexityResult(math.exp(total_nll / count), count, windows)


def hf_logits_fn(model: torch.nn.Module) -> LogitsFn:
    device = next(model.parameters()).device

    def run(ids: torch.Tensor) -> torch.Tensor:
        return model(ids.to(device), use_cache=False).logits

    return run
