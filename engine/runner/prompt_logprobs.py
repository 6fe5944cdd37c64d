"""Prompt logprobs (SamplingParams.prompt_logprobs): the logits at every row of a prompt
chunk give the logprob of the prompt token after it, as vLLM's prompt_logprobs.

The logits are made a slice of rows at a time, so a long chunk never holds a
[chunk, vocab] float32 tensor at once (2,048 rows of a 152k vocabulary would be 1.2 GB).
"""

from collections.abc import Callable, Sequence

import torch

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.runner.sampler import top_logprobs
from kvdeck.engine.types.outputs import Logprob

ROWS_PER_SLICE = 256


def prompt_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                    spans: list[tuple[int, int, int, int]], requests: Sequence[ScheduledSequence],
                    ) -> tuple[dict[int, tuple[int, list[dict[int, Logprob]]]], dict[int, str]]:
    """For each span (batch row, first flat row, first position, count): the logprob of
    prompt tokens position+1 .. position+count under the raw logits of the rows before them,
    each with the request's `prompt_logprobs` top candidates. And the batch rows whose
    logprobs could not be made, with why (that request fails alone)."""
    found: dict[int, tuple[int, list[dict[int, Logprob]]]] = {}
    failed: dict[int, str] = {}
    for index, row, start, count in spans:
        try:
            found[index] = (start, _span(compute_logits, hidden, row, start, count, requests[index]))
        except Exception as exc:  # noqa: BLE001 - one request's failure, reported as its own
            failed[index] = f"prompt logprobs: {type(exc).__name__}: {exc}"
    return found, failed


def _span(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, row: int,
          start: int, count: int, request: ScheduledSequence) -> list[dict[int, Logprob]]:
    top = request.params.prompt_logprobs or 0
    targets = request.prompt_token_ids[start + 1 : start + 1 + count]
    entries: list[dict[int, Logprob]] = []
    for offset in range(0, count, ROWS_PER_SLICE):
        n = min(ROWS_PER_SLICE, count - offset)
        logits = compute_logits(hidden[row + offset : row + offset + n])
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        entries += top_logprobs(logprobs, list(range(n)), targets[offset : offset + n], [top] * n)
    return entries
