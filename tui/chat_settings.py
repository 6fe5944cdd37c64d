"""The chat's settings: system prompt and sampling parameters (validated like SamplingParams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.sampling_params import SamplingParams

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(slots=True)
class ChatSettings:
    """Checked by SamplingParams in parse() and sampling_params(), not on construction:
    importing the engine package pulls in torch, which the UI does not need to start."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    seed: int | None = None

    def sampling_params(self) -> SamplingParams:
        from kvdeck.engine.types.sampling_params import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens, seed=self.seed)

    @classmethod
    def parse(cls, system_prompt: str, temperature: str, top_p: str, max_tokens: str,
              seed: str) -> ChatSettings:
        """Build from the settings form's text fields; ValueError names the bad field."""
        settings = cls(
            system_prompt=system_prompt,
            temperature=_parse_float("temperature", temperature),
            top_p=_parse_float("top_p", top_p),
            max_tokens=_parse_int("max_tokens", max_tokens),
            seed=None if not seed.strip() else _parse_int("seed", seed),
        )
        settings.sampling_params()  # SamplingParams' own checks (this imports the engine)
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
