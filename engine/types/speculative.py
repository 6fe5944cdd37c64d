"""Speculative decoding settings: vLLM's `speculative_config` JSON, validated without torch.

Two proposers: n-gram prompt lookup (`{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 2, "prompt_lookup_max": 5}`) and a draft model (`{"model": DIR,
"num_speculative_tokens": 4}`, method "draft_model" implied). `disable_by_batch_size` turns
speculation off for a step whose running batch has more requests than that, as vLLM's. The
per-request policy (kvdeck's own keys) pauses a request whose recent acceptance is poor.
"""

from dataclasses import asdict, dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
# vLLM accepts these spellings for a draft model; kvdeck knows one.
_DRAFT_ALIASES = ("draft_model", "model")
MAX_SPECULATIVE_TOKENS = 16
# Below this many running requests speculation always runs unless configured otherwise; at
# and above it verifying k extra tokens per request costs more than it saves on the engine's
# batched matrix products (README, "Speculative decoding").
DEFAULT_DISABLE_BY_BATCH_SIZE = 16
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
         "disable_by_batch_size", "min_acceptance_rate", "acceptance_window", "pause_steps",
         "quantization"}


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" | "draft_model"
    num_speculative_tokens: int
    model: str | None = None  # the draft: a directory or hub id ("demo-draft": the bundled one)
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    # Speculate only while the running batch has at most this many requests (None: always).
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    # Per request: when the acceptance rate of its last `acceptance_window` drafted tokens
    # falls below `min_acceptance_rate`, it decodes without drafts for `pause_steps` steps.
    min_acceptance_rate: float = 0.2
    acceptance_window: int = 16
    pause_steps: int = 16
    quantization: str | None = None  # the draft's; None: what its checkpoint says

    @classmethod
    def from_dict(cls, raw: Any) -> "SpeculativeConfig":
        """Parse vLLM's JSON (a dict); ValueError naming the offending key."""
        if isinstance(raw, SpeculativeConfig):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {raw!r}")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(_KEYS))})")
        method = raw.get("method")
        if method is None:
            method = "draft_model" if raw.get("model") is not None else None
        if method in _DRAFT_ALIASES:
            method = "draft_model"
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {METHODS} (or give a "
                             f"draft 'model'), got {raw.get('method')!r}")
        fields = {k: v for k, v in raw.items() if k != "method"}
        if "num_speculative_tokens" not in fields:
            raise ValueError("speculative_config.num_speculative_tokens is required")
        config = cls(method=method, **fields)
        config.validate()
        return config

    def validate(self) -> None:
        k = self.num_speculative_tokens
        _int_in("num_speculative_tokens", k, 1, MAX_SPECULATIVE_TOKENS)
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("speculative_config: method 'ngram' takes no 'model'")
            _int_in("prompt_lookup_min", self.prompt_lookup_min, 1, 64)
            _int_in("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min, 64)
        elif not isinstance(self.model, str) or not self.model:
            raise ValueError("speculative_config: a draft model needs 'model' (a directory or hub id)")
        if self.disable_by_batch_size is not None:
            _int_in("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 20)
        rate = self.min_acceptance_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"speculative_config.min_acceptance_rate must be in [0, 1], got {rate!r}")
        _int_in("acceptance_window", self.acceptance_window, 1, 1 << 16)
        _int_in("pause_steps", self.pause_steps, 0, 1 << 16)
        if self.quantization is not None and not isinstance(self.quantization, str):
            raise ValueError(f"speculative_config.quantization must be a string, got {self.quantization!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"speculative_config.{name} must be an integer in [{low}, {high}], got {value!r}")
