"""config.json, generation_config.json and the tokenizer files of a model imported from GGUF.

transformers rebuilds the config and the tokenizer (vocabulary, merges, special tokens, chat
template) from the GGUF's metadata; this adds what its GGUF config mapping leaves out and
kvdeck needs: the architecture name, the dtype, the head size where llama.cpp states it
apart (`attention.key_length`, Qwen3), and rope scaling, which llama.cpp stores as metadata
(linear) or, for Llama 3, as a tensor of per-frequency factors (`rope_freqs.weight`).
"""

import json
import math
from pathlib import Path

import numpy as np

from kvdeck.app.store.gguf.header import GGUFImportError

# Llama 3.x's band edges; the factors in the file are checked against them below.
_LLAMA3_LOW_FREQ_FACTOR = 1.0
_LLAMA3_HIGH_FREQ_FACTOR = 4.0


def load_hf_config(path: Path, reader, dtype_name: str):
    """The transformers config for the GGUF at `path`, completed for kvdeck."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kvdeck.app.store.inspect import SUPPORTED_ARCHITECTURES

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError) as exc:
        raise GGUFImportError(f"{path.name}: transformers cannot read its metadata ({exc})") from None
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFImportError(
            f"{path.name}: model type {config.model_type!r} ({architecture or 'no causal LM class'})"
            f" is not one kvdeck runs (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    config.architectures = [architecture]
    arch = _field(reader, "general.architecture")
    key_length = _field(reader, f"{arch}.attention.key_length")
    if isinstance(key_length, int) and key_length != getattr(config, "head_dim", None):
        config.head_dim = key_length
    rope = _rope_parameters(path, reader, arch, config)
    if rope is not None:
        config.rope_parameters = rope
    config.dtype = dtype_name
    return config


def write_model_files(out_dir: Path, path: Path, reader, config) -> None:
    """config.json, generation_config.json and the tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    data = config.to_dict()
    data.pop("_name_or_path", None)
    data.pop("_model_name_or_path", None)
    data["torch_dtype"] = data["dtype"] = str(config.dtype).replace("torch.", "")
    (out_dir / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    eos = [config.eos_token_id] if isinstance(config.eos_token_id, int) else list(config.eos_token_id or [])
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        extra = _field(reader, key)
        if isinstance(extra, int) and extra not in eos:
            eos.append(extra)
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError, NotImplementedError) as exc:
        raise GGUFImportError(f"{path.name}: transformers cannot rebuild its tokenizer ({exc})") from None
    tokenizer.save_pretrained(out_dir)


def _rope_parameters(path: Path, reader, arch: str, config) -> dict | None:
    base = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(base.get("rope_theta") or getattr(config, "rope_theta", 10000.0))
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        hint = _field(reader, f"{arch}.rope.scaling.original_context_length")
        return llama3_rope_from_factors(np.asarray(freqs.data, dtype=np.float64), theta, head_dim, hint)
    if scaling in (None, "none"):
        return None
    if scaling == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor") or 1.0)
        return {"rope_type": "linear", "factor": factor, "rope_theta": theta}
    raise GGUFImportError(f"{path.name}: rope scaling {scaling!r} is not supported (linear, llama3)")


def llama3_rope_from_factors(factors: np.ndarray, theta: float, head_dim: int, context_hint=None) -> dict:
    """Llama 3's rope_parameters from llama.cpp's per-frequency divisors, checked to reproduce them."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if factors.shape != inv_freq.shape:
        raise GGUFImportError(f"rope_freqs: {factors.size} values, head_dim {head_dim} needs {inv_freq.size}")
    factor = float(factors.max())
    wavelen = 2 * math.pi / inv_freq
    low, high = _LLAMA3_LOW_FREQ_FACTOR, _LLAMA3_HIGH_FREQ_FACTOR
    blended = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    if blended.any() and factor > 1:
        # In the blended band 1/f = (1 - s)/factor + s with s = (ctx/wavelen - low)/(high - low).
        smooth = (1 / factors[blended] - 1 / factor) / (1 - 1 / factor)
        context = int(round(float(np.median(wavelen[blended] * (smooth * (high - low) + low)))))
    else:
        context = int(context_hint) if isinstance(context_hint, int) else 8192
    params = {
        "rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
        "high_freq_factor": high, "original_max_position_embeddings": context,
    }  # fmt: skip
    if not np.allclose(llama3_factors(params, inv_freq), factors, rtol=1e-3, atol=1e-4):
        raise GGUFImportError("rope_freqs.weight does not match Llama 3 rope scaling; cannot import its rope")
    return params


def llama3_factors(params: dict, inv_freq: np.ndarray) -> np.ndarray:
    """The divisors llama.cpp's converter writes for these parameters."""
    factor, context = params["factor"], params["original_max_position_embeddings"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < context / high, 1.0, np.where(wavelen > context / low, factor, blended))


def _field(reader, key: str):
    """A scalar or string metadata value from gguf's reader, or None."""
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value
