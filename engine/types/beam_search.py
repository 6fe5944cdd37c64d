"""Beam search's settings and results, vLLM's shapes (`vllm.sampling_params.BeamSearchParams`,
`vllm.beam_search.BeamSearchOutput` / `BeamSearchSequence`) and its ranking score."""

import math
from dataclasses import dataclass, field

from kvdeck.engine.types.outputs import Logprob
from kvdeck.engine.types.sampling_params import GREEDY_BELOW_TEMPERATURE, MAX_LOGPROBS

# Each step asks every beam for its 2 * beam_width most likely next tokens (vLLM's and
# transformers' candidate count), and a request returns at most MAX_LOGPROBS of them.
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2


@dataclass(slots=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # above 0, each beam's sampled token joins its candidates
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name, value, low, high in (("beam_width", self.beam_width, 1, MAX_BEAM_WIDTH),
                                       ("max_tokens", self.max_tokens, 1, None)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < low or (high is not None and value > high):
                bound = f">= {low}" if high is None else f"in [{low}, {high}]"
                reason = " (each step asks for 2 * beam_width logprobs)" if high is not None else ""
                raise ValueError(f"{name} must be {bound}{reason}, got {value}")
        for name, value in (("temperature", self.temperature), ("length_penalty", self.length_penalty)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam. As in vLLM, `tokens` starts with the prompt's ids and `text` (filled in the
    output) is the decoding of all of them; `logprobs` has one entry per generated token:
    the candidates its step looked at."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (an EOS token) or "length"
    stop_reason: int | None = None  # the EOS token that ended it


@dataclass(slots=True)
class BeamSearchOutput:
    """One prompt's result: up to beam_width sequences, best first."""

    sequences: list[BeamSearchSequence]


def beam_search_score(tokens: list[int], cum_logprob: float, eos_token_ids: set[int] | frozenset[int],
                      length_penalty: float) -> float:
    """vLLM's get_beam_search_score: the cumulative logprob over the length (prompt
    included, a final EOS not) to the power `length_penalty`."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_token_ids else 0)
    return cum_logprob / (max(length, 1) ** length_penalty)
