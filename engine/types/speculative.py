"""Speculative decoding settings: vLLM's `speculative_config` JSON, validated without torch.

Three proposers: n-gram prompt lookup (`{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 2, "prompt_lookup_max": 5}`), suffix decoding (`{"method": "suffix"}`,
its `suffix_decoding_*` keys as vLLM's; num_speculative_tokens, the longest draft, defaults
to SUFFIX_DEFAULT_DRAFT within the tree depth) and a draft model (`{"model": DIR,
"num_speculative_tokens": 4}`, method "draft_model" implied). `{"method": "auto"}` is suffix
decoding under the gain policy (`"draft_policy": "gain"`, engine/core/spec/draft_budget.py):
each step verifies only the drafts whose expected acceptance pays for their rows, so
speculation turns itself on where it helps and off where it does not; any method may take it.
`disable_by_batch_size` turns speculation off for a step whose running batch has more
requests than that, as vLLM's. The fixed policy (kvdeck's own keys) pauses a request whose
recent acceptance is poor.
"""

from dataclasses import asdict, dataclass
from typing import Any

from kvdeck.engine.types.model_path import is_demo_model

METHODS = ("ngram", "suffix", "draft_model", "auto")
# "fixed": verify every draft the proposer makes (pausing a request whose acceptance is poor);
# "gain": verify those whose expected acceptance beats their cost (the default of "auto").
DRAFT_POLICIES = ("fixed", "gain")
# vLLM accepts these spellings for a draft model; kvdeck knows one.
_DRAFT_ALIASES = ("draft_model", "model")
MAX_SPECULATIVE_TOKENS = 16
DEMO_DRAFT = "demo-draft"  # as the draft's "model": the bundled draft of the bundled demo model
SUFFIX_TREE_DEPTH = 24  # vLLM's default suffix_decoding_max_tree_depth
# The longest draft a bf16 CPU model verifies bit for bit: seven drafts make a verify of eight
# rows, the most its decoder stack takes (kernels/cpu/native.py BF16_STACK_MAX_ROWS), so each
# verified token is plain greedy's; longer drafts, or several requests' verifies past eight
# rows in all, run the Python forward, whose matmuls round otherwise.
CPU_BF16_EXACT_MAX_DRAFT = 7
# The longest suffix draft unless configured (vLLM: the tree depth): on SmolLM2's agentic
# workload k=7 ran 2.59x against 2.42x for k=16
# (benchmarks/results/spec_decode_suffix_agentic_smollm2.json).
SUFFIX_DEFAULT_DRAFT = CPU_BF16_EXACT_MAX_DRAFT
MAX_SUFFIX_TREE_DEPTH = 1024  # each token appended costs a step per depth
# vLLM caches 10000 outputs; kvdeck's trees are Python objects, about 600 bytes per cached
# token, so it keeps 1000 (about 600 MB for outputs of 1000 tokens).
SUFFIX_CACHED_REQUESTS = 1000
# Below this many running requests speculation always runs unless configured otherwise; at
# and above it verifying k extra tokens per request costs more than it saves on the engine's
# batched matrix products (README, "Speculative decoding").
DEFAULT_DISABLE_BY_BATCH_SIZE = 16
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
         "disable_by_batch_size", "min_acceptance_rate", "acceptance_window", "pause_steps",
         "quantization", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
         "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_policy"}
_SUFFIX_KEYS = {k for k in _KEYS if k.startswith("suffix_decoding_")}


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" | "suffix" | "draft_model" | "auto"
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
    # Suffix decoding (vLLM's defaults but the cache size): the trees hold suffixes cut to
    # max_tree_depth tokens (a match plus its draft fit in it); the global tree caches the
    # outputs of the last max_cached_requests requests (0: none); a draft is at most
    # max_spec_factor x the match length, of tokens of estimated probability >= min_token_prob.
    suffix_decoding_max_tree_depth: int = SUFFIX_TREE_DEPTH
    suffix_decoding_max_cached_requests: int = SUFFIX_CACHED_REQUESTS
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    draft_policy: str = "fixed"

    @property
    def uses_suffix_trees(self) -> bool:
        return self.method in ("suffix", "auto")

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
        if method == "auto":
            fields.setdefault("draft_policy", "gain")
        if method not in ("suffix", "auto") and (stray := sorted(_SUFFIX_KEYS & set(fields))):
            raise ValueError(f"speculative_config: {', '.join(stray)} belong(s) to methods 'suffix' "
                             f"and 'auto', not {method!r}")
        if method in ("suffix", "auto") and "num_speculative_tokens" not in fields:
            # The longest draft; each step's length follows the match (vLLM: the tree depth).
            depth = fields.get("suffix_decoding_max_tree_depth", SUFFIX_TREE_DEPTH)
            _int_in("suffix_decoding_max_tree_depth", depth, 1, MAX_SUFFIX_TREE_DEPTH)
            fields["num_speculative_tokens"] = min(depth, SUFFIX_DEFAULT_DRAFT)
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
        elif self.method in ("suffix", "auto"):
            self._validate_suffix()
        elif not isinstance(self.model, str) or not self.model:
            raise ValueError("speculative_config: a draft model needs 'model' (a directory or hub id)")
        if self.disable_by_batch_size is not None:
            _int_in("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 20)
        rate = self.min_acceptance_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"speculative_config.min_acceptance_rate must be in [0, 1], got {rate!r}")
        _int_in("acceptance_window", self.acceptance_window, 1, 1 << 16)
        _int_in("pause_steps", self.pause_steps, 0, 1 << 16)
        if self.draft_policy not in DRAFT_POLICIES:
            raise ValueError(f"speculative_config.draft_policy must be one of {DRAFT_POLICIES}, "
                             f"got {self.draft_policy!r}")
        if self.quantization is not None and not isinstance(self.quantization, str):
            raise ValueError(f"speculative_config.quantization must be a string, got {self.quantization!r}")

    def _validate_suffix(self) -> None:
        if self.model is not None:
            raise ValueError(f"speculative_config: method {self.method!r} takes no 'model'")
        depth = self.suffix_decoding_max_tree_depth
        _int_in("suffix_decoding_max_tree_depth", depth, 1, MAX_SUFFIX_TREE_DEPTH)
        _int_in("suffix_decoding_max_cached_requests", self.suffix_decoding_max_cached_requests, 0, 1 << 31)
        factor = self.suffix_decoding_max_spec_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0.0 <= factor <= 1024.0:
            raise ValueError("speculative_config.suffix_decoding_max_spec_factor must be a number in "
                             f"[0, 1024], got {factor!r}")
        prob = self.suffix_decoding_min_token_prob
        if isinstance(prob, bool) or not isinstance(prob, int | float) or not 0.0 <= prob <= 1.0:
            raise ValueError("speculative_config.suffix_decoding_min_token_prob must be in [0, 1], "
                             f"got {prob!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bundled_drafts(model: str | None) -> tuple[str, ...]:
    """The bundled drafts that share `model`'s tokenizer (None: the demo model): demo-draft
    for the demo model, none for any other."""
    return (DEMO_DRAFT,) if is_demo_model(model) else ()


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"speculative_config.{name} must be an integer in [{low}, {high}], got {value!r}")
