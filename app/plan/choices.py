"""One engine configuration the planner runs (the base, or an alternative), and the
`--try KEY=VALUE[,KEY=VALUE]` alternatives as the command line gives them."""

from dataclasses import dataclass, replace

from kvdeck.engine.types.config import BLOCK_SIZES, EngineConfig

PREEMPTION_MODES = ("recompute", "swap", "auto")


def engine_default_preemption() -> str:
    """The engine's own default (recompute where this kvdeck has no swap preemption)."""
    return getattr(EngineConfig(), "preemption_mode", "recompute")


@dataclass(frozen=True, slots=True)
class EngineChoice:
    label: str
    num_blocks: int  # the KV pool
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    windows: tuple[int | None, ...] = (None,)  # the keys each KV group's layers see
    pool_note: str = ""  # how the pool was sized ("RTX 4090: 21.6 GiB - weights ...")
    # Preemption (engine/core/swap.py where this kvdeck has it): recompute | swap | auto, and
    # the host swap space; block_bytes sizes the swap space and the copies' time.
    preemption_mode: str = "recompute"
    swap_space_gib: float = 4.0
    block_bytes: int = 0

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        for name in ("num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)} "
                                 f"({self.label}{': ' + self.pool_note if self.pool_note else ''})")


# What `--try` may change (the pool follows from a GPU, a KV dtype or a block size when the
# base was sized from a GPU: the caller re-sizes it).
TRY_KEYS = {
    "block_size": int, "num_blocks": int, "max_num_seqs": int, "max_num_batched_tokens": int,
    "enable_prefix_caching": None, "kv_cache_dtype": str, "gpu": str, "max_model_len": int,
    "preemption_mode": str,
}
_ALIASES = {"prefix_caching": "enable_prefix_caching", "pool": "num_blocks",
            "kv_dtype": "kv_cache_dtype", "blocks": "num_blocks", "preemption": "preemption_mode"}


def parse_try(text: str) -> dict[str, object]:
    """"block_size=32,max_num_seqs=8" -> {"block_size": 32, "max_num_seqs": 8}; ValueError
    naming a bad key or value."""
    changes: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        key = _ALIASES.get(key, key)
        if not sep or key not in TRY_KEYS:
            raise ValueError(f"--try {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(TRY_KEYS)}")
        kind = TRY_KEYS[key]
        value = value.strip()
        if kind is None:
            if value.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise ValueError(f"--try {text!r}: {key} is on or off, got {value!r}")
            changes[key] = value.lower() in ("on", "true", "1")
        elif kind is int:
            try:
                changes[key] = int(value)
            except ValueError:
                raise ValueError(f"--try {text!r}: {key} must be an integer, got {value!r}") from None
        else:
            changes[key] = value
    if not changes:
        raise ValueError(f"--try {text!r} changes nothing")
    mode = changes.get("preemption_mode")
    if mode is not None and mode not in PREEMPTION_MODES:
        raise ValueError(f"--try {text!r}: preemption_mode is one of {', '.join(PREEMPTION_MODES)}")
    return changes


def with_changes(base: EngineChoice, changes: dict[str, object], label: str) -> EngineChoice:
    fields = {k: v for k, v in changes.items() if k != "gpu"}
    return replace(base, label=label, **fields)
