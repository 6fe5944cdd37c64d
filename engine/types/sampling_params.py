"""Per-request sampling settings, validated on construction (vLLM's names).

Every numeric field is bounded to what the sampler, torch and the kernels accept
(`SAMPLING_BOUNDS`, read by the server's request schema too), so a request that passes
validation cannot fail inside the engine for its values. Non-finite numbers are refused.
"""

import math
from dataclasses import dataclass, field
from enum import IntEnum

from kvdeck.engine.types.structured import StructuredOutputsParams

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_CHOICES = 128  # n per request (OpenAI's limit); each choice is an engine request
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
LOGIT_BIAS_RANGE = 100.0  # OpenAI's: -100 bans a token, 100 all but forces it
# Temperatures below this sample greedily: dividing logits by them overflows float32 (vLLM's
# _SAMPLING_EPS).
GREEDY_BELOW_TEMPERATURE = 1e-5


class RequestOutputKind(IntEnum):
    """What a request's outputs carry (vLLM's names)."""

    CUMULATIVE = 0  # each output: the whole completion so far (text, token ids, logprobs)
    DELTA = 1  # each output: only what is new since the previous one
    FINAL_ONLY = 2  # one output, when the request finishes, with the whole completion


@dataclass(slots=True, frozen=True)
class Bound:
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # `low` itself is not allowed

    def describe(self) -> str:
        low = "-inf" if self.low is None else _number(self.low)
        high = "inf" if self.high is None else _number(self.high)
        return f"{'(' if self.low_open else '['}{low}, {high}]"

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


SAMPLING_BOUNDS: dict[str, Bound] = {
    "n": Bound(1, MAX_CHOICES),
    "temperature": Bound(0.0, None),
    "top_p": Bound(0.0, 1.0, low_open=True),
    "top_k": Bound(-1, INT32_MAX),  # -1 or 0: no limit; larger than the vocabulary: no limit
    "min_p": Bound(0.0, 1.0),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(0.0, None, low_open=True),
    "seed": Bound(INT64_MIN, INT64_MAX),  # torch generators take 64-bit seeds
    "max_tokens": Bound(1, INT64_MAX),
    "min_tokens": Bound(0, INT64_MAX),
    "logprobs": Bound(0, MAX_LOGPROBS),
    "prompt_logprobs": Bound(0, MAX_LOGPROBS),
}
_INTEGER_FIELDS = {"n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"}


@dataclass(slots=True)
class SamplingParams:
    n: int = 1  # choices per prompt; the front-end fans them out (frontend/parent_request.py)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no limit
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # token id -> a number in [-100, 100] added to its logit before sampling (OpenAI's and
    # vLLM's logit_bias); logprobs stay the model's own.
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None  # number of top logprobs to return beside the sampled token
    # Each prompt token's logprob (from the first token on) with that many top candidates;
    # such a request reads nothing from the prefix cache (its prompt must be computed).
    prompt_logprobs: int | None = None
    # Also hand back the prompt's embedding with the first token: its last token's final
    # hidden state (after the model's last norm), L2-normalised (LLM.embed, /v1/embeddings).
    embed: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only (benchmarks), no text, no stop strings
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the output must match
    # DELTA and FINAL_ONLY spare the front-end a copy of the whole completion per token.
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Derived by validate() (which the core runs again on receipt), so that the sampler reads
    # one flag a row instead of the settings: repetition, presence or frequency penalties;
    # and greedy with none of them, no min_tokens and no logprobs (its token is the argmax
    # of the logits as they are).
    has_penalties: bool = field(default=False, init=False, repr=False, compare=False)
    plain_greedy: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def validate(self) -> None:
        for name, bound in SAMPLING_BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
                continue
            _check(name, value, bound, integer=name in _INTEGER_FIELDS)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise ValueError(f"stop strings may be at most {MAX_STOP_STRING_CHARS} characters, "
                                 f"got one of {len(s)}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, "
                             f"got {len(self.stop_token_ids)}")
        for t in self.stop_token_ids:
            _check("stop_token_ids[]", t, Bound(0, INT64_MAX), integer=True)
        if self.logit_bias is not None:
            _check_logit_bias(self.logit_bias)
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams")
            self.structured_outputs.validate()
        self.has_penalties = bool(self.repetition_penalty != 1.0 or self.presence_penalty
                                  or self.frequency_penalty)
        self.plain_greedy = (self.greedy and not self.has_penalties and self.min_tokens == 0
                             and self.logprobs is None and not self.logit_bias)


def embedding_params(output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE) -> SamplingParams:
    """An embedding request's (LLM.embed, /v1/embeddings): its prefill gives the embedding;
    the one token sampled after it is dropped."""
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False, embed=True,
                          output_kind=output_kind)


def _check_logit_bias(bias: object) -> None:
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a mapping of token ids to numbers, got {bias!r}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}")
    for token, value in bias.items():
        _check("logit_bias token id", token, Bound(0, INT64_MAX), integer=True)
        _check(f"logit_bias[{token}]", value, Bound(-LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE), integer=False)


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _check(name: str, value: object, bound: Bound, integer: bool) -> None:
    if integer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    elif not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if not bound.holds(value):
        raise ValueError(f"{name} must be in {bound.describe()}, got {value}")
