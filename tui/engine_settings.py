"""The engine options the TUI can change (ctrl+e): speculative decoding and the KV cache's
dtype. Both are fixed when the engine starts, so saving restarts it with the new options.

Validated here with the engine's own light config types (no torch), so a bad value is
refused in the form, naming the field, instead of as an engine start-up error. The form
offers the proposers that fit the loaded model: n-gram lookup and suffix decoding always, a
bundled draft only beside the model whose tokenizer it shares, and a draft of the user's own
(the engine checks its vocabulary when it loads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdeck.engine.types.config import KV_CACHE_DTYPES
from kvdeck.engine.types.speculative import (
    CPU_BF16_EXACT_MAX_DRAFT,
    DEMO_DRAFT,
    MAX_SPECULATIVE_TOKENS,
    SpeculativeConfig,
    bundled_drafts,
)

SPECULATION_CHOICES = (("off", "off"), ("automatic: suffix drafts where they pay", "auto"),
                       ("n-gram prompt lookup", "ngram"), ("suffix decoding", "suffix"))
# What the TUI starts with unless --speculative-config says otherwise: the gain policy keeps a
# draft only where its expected acceptance pays for its row, so it costs nothing where
# nothing repeats (docs/guide/speculative-decoding.md).
TUI_DEFAULT_SPECULATION = {"method": "auto"}
CUSTOM_DRAFT_CHOICE = ("draft model: your own", "draft_model")  # its folder or hub id below
BUNDLED_PREFIX = "bundled:"  # the form's value for a bundled draft: "bundled:demo-draft"
BUNDLED_DRAFTS = (DEMO_DRAFT,)
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
# n-gram lookup as the README's example: match the last 2 to 5 tokens.
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}


@dataclass(slots=True)
class EngineSettings:
    speculation: str = "off"  # "off" | "auto" | "ngram" | "suffix" | "draft_model"
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    draft_model: str = ""  # the draft's folder, hub id or bundled name
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
            settings.draft_model = spec.model or ""
        return settings

    @classmethod
    def parse(cls, speculation: str, num_tokens: str, draft_model: str,
              kv_cache_dtype: str) -> EngineSettings:
        """The form's fields; ValueError naming the one that is wrong. `speculation` is the
        form's choice: a method, or BUNDLED_PREFIX and a bundled draft's name."""
        bundled = speculation.removeprefix(BUNDLED_PREFIX)
        if speculation.startswith(BUNDLED_PREFIX) and bundled in BUNDLED_DRAFTS:
            speculation, draft_model = "draft_model", bundled
        elif speculation not in {value for _, value in (*SPECULATION_CHOICES, CUSTOM_DRAFT_CHOICE)}:
            raise ValueError(f"speculative decoding: unknown choice {speculation!r}")
        try:
            k = int(num_tokens.strip())
        except ValueError:
            raise ValueError(f"speculative tokens must be a whole number, got {num_tokens!r}") from None
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {k}")
        draft = draft_model.strip()
        if speculation == "draft_model" and not draft:
            raise ValueError("a draft model needs a folder or hub id (sharing the model's tokenizer)")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"KV cache dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {kv_cache_dtype!r}")
        settings = cls(speculation, k, draft if speculation == "draft_model" else "", kv_cache_dtype)
        settings.speculative_config()  # the engine's own validation
        return settings

    def speculative_config(self) -> dict | None:
        """vLLM's speculative_config JSON for these settings (None: off)."""
        if self.speculation == "off":
            return None
        if self.speculation == "ngram":
            raw = {"method": "ngram", "num_speculative_tokens": self.num_speculative_tokens,
                   **NGRAM_LOOKUP}
        elif self.speculation in ("suffix", "auto"):
            # k is the longest draft; suffix decoding's own keys keep their defaults.
            raw = {"method": self.speculation, "num_speculative_tokens": self.num_speculative_tokens}
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
        elif self.speculation == "auto":
            spec = ("automatic speculation (suffix drafts where they pay), "
                    f"up to k={self.num_speculative_tokens}")
        elif self.speculation == "draft_model":
            spec = f"draft {self.draft_model}, k={self.num_speculative_tokens}"
        else:
            spec = "no speculation"
        return f"{spec}; KV cache {self.kv_cache_dtype}"


def speculation_choices(model: str | None) -> list[tuple[str, str]]:
    """The form's proposers for `model` (None: the demo model): off, n-gram lookup and suffix
    decoding, the bundled drafts that share its tokenizer, and a draft of the user's own."""
    drafts = [(f"draft model: {name}", BUNDLED_PREFIX + name) for name in bundled_drafts(model)]
    return [*SPECULATION_CHOICES, *drafts, CUSTOM_DRAFT_CHOICE]


def form_speculation(settings: EngineSettings, choices: list[tuple[str, str]]) -> str:
    """The form's choice for `settings`: a bundled draft where the form offers it, else the
    method (a draft the form does not offer shows in the custom draft field)."""
    bundled = BUNDLED_PREFIX + settings.draft_model
    if settings.speculation == "draft_model" and bundled in {value for _, value in choices}:
        return bundled
    return settings.speculation


def exactness_hint(speculation: str, num_tokens: str, device: str | None, dtype: str | None) -> str:
    """A line for the k field where greedy output can part from plain greedy decoding's: on a
    bf16 CPU engine a verify of more than CPU_BF16_EXACT_MAX_DRAFT + 1 rows leaves the native
    decoder stack for the Python forward, whose matmuls round otherwise ("" where it keeps
    to plain greedy's bits, or the engine is elsewhere or not known)."""
    if speculation == "off" or device != "cpu" or dtype != "bfloat16":
        return ""
    try:
        k = int(num_tokens.strip())
    except ValueError:
        return ""
    if k <= CPU_BF16_EXACT_MAX_DRAFT:
        return ""
    return (f"k > {CPU_BF16_EXACT_MAX_DRAFT} on a bf16 CPU: greedy output may part from plain "
            "decoding in its last bits")
