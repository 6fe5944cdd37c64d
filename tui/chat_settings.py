"""The chat's settings: system prompt and sampling parameters (validated like SamplingParams)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.sampling_params import SamplingParams

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
AUTO_MAX_TOKENS_SHARE = 4  # auto max_tokens: a quarter of the context, the rest for history
AUTO_MAX_TOKENS_CAP = 1024  # ...but no more than this on long-context models
MIN_REPLY_TOKENS = 16  # a message that leaves less room than this for the reply is refused


def auto_max_tokens(max_model_len: int) -> int:
    """The reply budget when the user sets none: a share of the context, so a conversation
    keeps a few turns of history."""
    return max(1, min(AUTO_MAX_TOKENS_CAP, max_model_len // AUTO_MAX_TOKENS_SHARE))


@dataclass(slots=True)
class ChatSettings:
    """Checked by SamplingParams in parse() and sampling_params(), not on construction:
    the UI starts before it needs the engine's types."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int | None = None  # None: auto_max_tokens(max_model_len)
    seed: int | None = None

    def reply_budget(self, max_model_len: int) -> int:
        return self.max_tokens if self.max_tokens is not None else auto_max_tokens(max_model_len)

    def sampling_params(self, max_tokens: int | None = None) -> SamplingParams:
        """The request's parameters; `max_tokens` is the budget fitted to the context
        (without one, and with auto max_tokens, SamplingParams' default)."""
        from kvdeck.engine.types.sampling_params import SamplingParams

        if max_tokens is None:
            max_tokens = self.max_tokens
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                              **extra)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> ChatSettings:
        """ValueError naming the bad field (a hand-edited settings file, say)."""
        if not isinstance(data, dict):
            raise ValueError("chat settings must be a JSON object")
        default = cls()
        max_tokens, seed = data.get("max_tokens"), data.get("seed")
        return cls.parse(
            str(data.get("system_prompt", default.system_prompt)),
            str(data.get("temperature", default.temperature)),
            str(data.get("top_p", default.top_p)),
            "" if max_tokens is None else str(max_tokens),
            "" if seed is None else str(seed),
        )

    @classmethod
    def parse(cls, system_prompt: str, temperature: str, top_p: str, max_tokens: str,
              seed: str) -> ChatSettings:
        """Build from the settings form's text fields (blank max_tokens: auto, blank seed:
        random); ValueError names the bad field."""
        settings = cls(
            system_prompt=system_prompt,
            temperature=_parse_float("temperature", temperature),
            top_p=_parse_float("top_p", top_p),
            max_tokens=None if not max_tokens.strip() else _parse_int("max_tokens", max_tokens),
            seed=None if not seed.strip() else _parse_int("seed", seed),
        )
        settings.sampling_params()  # SamplingParams' own checks
        return settings


def _parse_float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None
