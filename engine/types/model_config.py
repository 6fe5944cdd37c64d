"""The parts of a Hugging Face config.json that kvdeck's models need, read without
transformers' config classes so old (rope_scaling) and new (rope_parameters) files load.
Family-specific fields (Gemma's soft caps, Phi-3's partial rotary) are read by the family's
model from `raw`.
Light (no torch): the model store and the server read it too."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.engine.types.config import DTYPE_ALIASES


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope_theta: float
    rope_scaling: dict | None  # with rope_type; LongRoPE's carries original_max_position_embeddings
    checkpoint_dtype: str  # a DTYPE_ALIASES value: float32 | float16 | bfloat16
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    quantization_config: dict | None = None
    partial_rotary_factor: float = 1.0  # the share of head_dim that is rotated (Phi-4-mini: 0.75)
    # Keys a query may see, if any layer limits it (Mistral v0.1, Qwen2 with
    # use_sliding_window, Phi-3 mini, Gemma 2/3's local layers).
    sliding_window: int | None = None
    # Per layer: the keys a query of that layer sees (the window, or None: all of them).
    layer_windows: list[int | None] = field(default_factory=list)
    # The rope of the sliding-window layers where it differs from the rest (Gemma 3:
    # rope_local_base_freq, no scaling): (theta, scaling).
    local_rope: tuple[float, dict | None] | None = None
    raw: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layer_windows:
            self.layer_windows = [self.sliding_window] * self.num_hidden_layers

    @property
    def long_rope_from(self) -> int | None:
        """LongRoPE (Phi-3): a sequence longer than this (the pretraining context) rotates
        every position with the long factors, shorter ones with the short factors."""
        if self.rope_scaling is None or self.rope_scaling.get("rope_type") != "longrope":
            return None
        return int(self.rope_scaling["original_max_position_embeddings"])

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token for all layers, at 2 bytes per element (fp16/bf16)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2


def read_model_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    return model_config_from_dict(raw, model_dir)


def model_config_from_dict(raw: dict, model_dir: Path | None = None) -> ModelConfig:
    if "text_config" in raw and "hidden_size" not in raw:
        raw = {**raw["text_config"], "architectures": raw.get("architectures", [])}
    architectures = raw.get("architectures") or []
    if not architectures:
        raise ValueError("config.json names no architecture ('architectures' is missing)")
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        local_rope = None
        if "full_attention" in rope or "sliding_attention" in rope:  # per layer type (Gemma 3)
            local = dict(rope.get("sliding_attention") or {})
            rope = dict(rope.get("full_attention") or {})
            local_rope = _rope_theta_and_scaling(raw, local, 10000.0)
        elif "rope_local_base_freq" in raw:  # Gemma 3's older config.json
            local_rope = (float(raw["rope_local_base_freq"]), None)
        rope_theta, rope_scaling = _rope_theta_and_scaling(raw, rope, float(raw.get("rope_theta") or 10000.0))
        model_type = raw.get("model_type", "")
        eos = raw.get("eos_token_id")
        quant = raw.get("quantization_config")
        return ModelConfig(
            architecture=architectures[0],
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            # transformers' Gemma configs tie by default and may leave the key out.
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", model_type.startswith("gemma"))),
            attention_bias=bool(raw.get("attention_bias", False)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            checkpoint_dtype=_checkpoint_dtype(raw),
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            bos_token_id=raw.get("bos_token_id"),
            quantization_config=quant if isinstance(quant, dict) else None,
            partial_rotary_factor=float(raw.get("partial_rotary_factor")
                                        or rope.get("partial_rotary_factor") or 1.0),
            sliding_window=_sliding_window(raw),
            layer_windows=layer_windows(raw),
            local_rope=local_rope,
            raw=raw,
        )
    except KeyError as exc:
        where = f" in {model_dir}/config.json" if model_dir else ""
        raise ValueError(f"config.json is missing the field {exc.args[0]!r}{where}") from exc


def _rope_theta_and_scaling(raw: dict, rope: dict, default_theta: float) -> tuple[float, dict | None]:
    """(theta, scaling with its rope_type, or None for plain rope) of one rope_parameters dict."""
    theta = float(rope.get("rope_theta") or default_theta)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "su":  # Phi-3's first name for LongRoPE
        rope_type = "longrope"
    if rope_type == "default":
        return theta, None
    scaling = {**rope, "rope_type": rope_type}
    if rope_type == "longrope":
        # Phi-3 keeps the pretraining context outside rope_scaling; the default attention
        # factor is computed from the ratio of the two lengths (transformers' rule).
        scaling.setdefault("original_max_position_embeddings",
                           raw.get("original_max_position_embeddings")
                           or raw.get("max_position_embeddings", 2048))
        scaling.setdefault("max_position_embeddings", raw.get("max_position_embeddings", 2048))
    return theta, scaling


def _sliding_window(raw: dict) -> int | None:
    windows = [w for w in layer_windows(raw) if w is not None]
    return windows[0] if windows else None


def layer_windows(raw: dict) -> list[int | None]:
    """The window of each layer (None: full attention), from `layer_types` where the config
    lists them, else from each family's older fields."""
    num_layers = int(raw["num_hidden_layers"])
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"layer_types {unknown} are not supported (kvdeck runs full and "
                             "sliding_attention layers)")
        if len(layer_types) != num_layers:
            raise ValueError(f"layer_types lists {len(layer_types)} layers, the model has {num_layers}")
        if window is None and "sliding_attention" in layer_types:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        return [int(window) if kind == "sliding_attention" else None for kind in layer_types]
    if not window or raw.get("use_sliding_window") is False:
        return [None] * num_layers
    window = int(window)
    model_type = raw.get("model_type", "")
    if model_type == "gemma2":  # even layers are local
        return [window if i % 2 == 0 else None for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):  # every `pattern`-th layer is global
        pattern = int(raw.get("sliding_window_pattern", 6))
        return [None if (i + 1) % pattern == 0 else window for i in range(num_layers)]
    if "max_window_layers" in raw:  # Qwen2: layers from max_window_layers on use the window
        first = int(raw["max_window_layers"])
        return [window if i >= first else None for i in range(num_layers)]
    return [window] * num_layers  # Mistral v0.1, Phi-3 mini: every layer


def _checkpoint_dtype(raw: dict) -> str:
    name = str(raw.get("torch_dtype") or raw.get("dtype") or "float32").replace("torch.", "")
    return DTYPE_ALIASES.get(name, "float32")
