"""The engine options the TUI can change (ctrl+e): speculative decoding and the KV cache's
dtype. Both are fixed when the engine starts, so saving restarts it with the new options.

Validated here with the engine's own light config types (no torch), so a bad value is
refused in the form, naming the field, instead of as an engine start-up error.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdeck.engine.types.config import KV_CACHE_DTYPES
from kvdeck.engine.types.speculative import MAX_SPECULATIVE_TOKENS, SpeculativeConfig

SPECULATION_CHOICES = (("off", "off"), ("n-gram prompt lookup", "ngram"),
                       ("suffix decoding", "suffix"), ("draft model", "draft_model"))
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
DEFAULT_DRAFT_MODEL = "demo-draft"  # the bundled draft of the demo model
# n-gram lookup as the README's example: match the last 2 to 5 tokens.
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}


@dataclass(slots=True)
class EngineSettings:
    speculation: str = "off"  # "off" | "ngram" | "suffix" | "draft_model"
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    draft_model: str = DEFAULT_DRAFT_MODEL
    kv_cache_dtype: str = "auto"

    @classmethod
    def from_engine_options(cls, options: dict) -> EngineSettings:
        """What the engine was started with (the command line's flags, or the last save)."""
        settings = cls(kv_cache_dtype=str(options.get("kv_cache_dtype") or "auto"))
        raw = options.get("speculative_config")
        if raw:
            spec = SpeculativeConfig.from_dict(raw)
            settings.speculation = spec.method
            settings.num_speculative_tokens = spec.num_speculative_tokens
            settings.draft_model = spec.model or DEFAULT_DRAFT_MODEL
        return settings

    @classmethod
    def parse(cls, speculation: str, num_tokens: str, draft_model: str,
              kv_cache_dtype: str) -> EngineSettings:
        """The form's fields; ValueError naming the one that is wrong."""
        if speculation not in {value for _, value in SPECULATION_CHOICES}:
            raise ValueError(f"speculative decoding: unknown choice {speculation!r}")
        try:
            k = int(num_tokens.strip())
        except ValueError:
            raise ValueError(f"speculative tokens must be a whole number, got {num_tokens!r}") from None
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}")
        draft = draft_model.strip()
        if speculation == "draft_model" and not draft:
            raise ValueError("a draft model needs a folder or hub id (demo-draft: the bundled one)")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"KV cache dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {kv_cache_dtype!r}")
        settings = cls(speculation, k, draft or DEFAULT_DRAFT_MODEL, kv_cache_dtype)
        settings.speculative_config()  # the engine's own validation
        return settings

    def speculative_config(self) -> dict | None:
        """vLLM's speculative_config JSON for these settings (None: off)."""
        if self.speculation == "off":
            return None
        if self.speculation == "ngram":
            raw = {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                   **NGRAM_LOOKUP}
        elif self.speculation == "suffix":
            # k is the longest draft; suffix decoding's own keys keep their defaults.
            raw = {"method": "suffix", "num_speculative_tokens": self.num_speculative_tokens}
        else:
            raw = {"model": self.draft_model, "num_speculative_tokens": self.num_speculative_tokens}
        SpeculativeConfig.from_dict(raw)
        return raw

    def apply(self, options: dict) -> dict:
        """The engine options with these settings in place of the old ones."""
        updated = {k: v for k, v in options.items()
                   if k not in ("speculative_config", "kv_cache_dtype")}
        spec = self.speculative_config()
        if spec is not None:
            updated["speculative_config"] = spec
        if self.kv_cache_dtype != "auto":
            updated["kv_cache_dtype"] = self.kv_cache_dtype
        return updated

    def describe(self) -> str:
        """One line for the notification after a restart."""
        if self.speculation == "ngram":
            spec = f"n-gram speculation, k={self.num_speculative_tokens}"
        elif self.speculation == "suffix":
            spec = f"suffix decoding, up to k={self.num_speculative_tokens}"
        elif self.speculation == "draft_model":
            spec = f"draft {self.draft_model}, k={self.num_speculative_tokens}"
        else:
            spec = "no speculation"
        return f"{spec}; KV cache {self.kv_cache_dtype}"
