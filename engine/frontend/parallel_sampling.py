"""Parallel sampling (n > 1) on the client side, as vLLM v1 does it: one engine request
per choice. The core schedules them like any others, and prefix caching lets them
share the prompt's full blocks once the first has computed them (the block map shows
those blocks shared)."""

from dataclasses import replace

from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.sampling_params import INT64_MIN, SamplingParams


def choice_params(params: SamplingParams) -> list[SamplingParams]:
    """One SamplingParams (n=1) per choice. A seed is offset by the choice index (wrapping
    around the 64-bit range), so the choices differ while the whole request stays
    reproducible."""
    return [replace(params, n=1, seed=None if params.seed is None else _offset_seed(params.seed, index))
            for index in range(params.n)]


def _offset_seed(seed: int, index: int) -> int:
    return (seed + index - INT64_MIN) % 2**64 + INT64_MIN


def merge_choices(outputs: list[RequestOutput]) -> RequestOutput:
    """The final outputs of one prompt's choices as one output with n completions."""
    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    return replace(first, outputs=[replace(out.outputs[0], index=index)
                                   for index, out in enumerate(outputs)],
                   finished=all(out.finished for out in outputs), delta_text="", delta_token_ids=[])

