"""The served model as Ollama's API describes it (/api/tags, /api/show, /api/ps), and the
names Ollama's clients give it.

Ollama names models `name:tag`, so the served name is listed as `NAME:latest` and a request
may name the model with or without `:latest` (or by any alias the OpenAI routes accept).
The description is read once from the model folder's config and safetensors headers:
format, family, parameter count, quantisation, size, and a digest of those files.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.store.inspect import InvalidModelError, describe_model, weight_files
from kvdeck.app.store.recommended import format_params
from kvdeck.engine.types.lora import LoRARequest

LATEST = ":latest"
_DTYPE_LEVELS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
# config.json keys as Ollama's model_info names them (after "<family>.")
_MODEL_INFO_KEYS = {"max_position_embeddings": "context_length", "num_hidden_layers": "block_count",
                    "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
                    "num_attention_heads": "attention.head_count",
                    "num_key_value_heads": "attention.head_count_kv",
                    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
                    "rope_theta": "rope.freq_base", "vocab_size": "vocab_size"}
# generation_config.json keys as Ollama's PARAMETER lines name them
_PARAMETER_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repeat_penalty"}


def tagged_name(served: str) -> str:
    """The served name as Ollama lists it: with a tag (`:latest` unless it has one)."""
    return served if ":" in served.rsplit("/", 1)[-1] else served + LATEST


def check_ollama_model(state: ServeState, model: str) -> LoRARequest | None:
    """404, in Ollama's words but naming the model served, unless `model` names it or a LoRA
    adapter (with or without `:latest`; then the adapter's LoRARequest)."""
    untagged = model.removesuffix(LATEST)
    names = {state.model_name, *state.model_aliases}
    if model in names or untagged in names or model == tagged_name(state.model_name):
        return None
    if state.adapters is not None:
        lora = state.adapters.get(model) or state.adapters.get(untagged)
        if lora is not None:
            return lora
    raise OpenAIError(404, f"model \"{model}\" not found: this server serves "
                           f"\"{tagged_name(state.model_name)}\" (or \"{state.model_name}\")",
                      param="model")


@dataclass(slots=True, frozen=True)
class ModelCard:
    name: str  # tagged
    size: int  # bytes on disk
    digest: str
    modified_at: str
    details: dict
    model_info: dict
    parameters: str  # Ollama's PARAMETER lines, from generation_config.json
    model_dir: Path

    def listing(self) -> dict:
        """One entry of /api/tags."""
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at,
                "size": self.size, "digest": self.digest, "details": self.details}


def model_card(state: ServeState, cache: dict[Path, ModelCard]) -> ModelCard:
    """The served model's card (503 until the engine has found its folder); `cache` keeps
    one per folder, so the headers are read once."""
    model_dir = state.engine.model_dir
    if model_dir is None:
        raise OpenAIError(503, "the engine is starting: the model is not loaded yet",
                          code="engine_starting", retry_after=5)
    if model_dir not in cache:
        cache[model_dir] = _read_card(tagged_name(state.model_name), Path(model_dir))
    return cache[model_dir]


def _read_card(name: str, model_dir: Path) -> ModelCard:
    try:
        description = describe_model(model_dir)
        files = [model_dir / "config.json", *weight_files(model_dir)]
    except InvalidModelError as exc:
        raise OpenAIError(500, f"cannot describe the served model: {exc}") from None
    config = description.config
    family = str(config.get("model_type") or description.architecture)
    level = description.quantization or _DTYPE_LEVELS.get(description.dtype, description.dtype)
    details = {"parent_model": "", "format": "safetensors", "family": family,
               "families": [family], "parameter_size": format_params(description.num_params),
               "quantization_level": level.upper()}
    info: dict = {"general.architecture": family,
                  "general.parameter_count": description.num_params}
    for key, suffix in _MODEL_INFO_KEYS.items():
        if isinstance(config.get(key), int | float):
            info[f"{family}.{suffix}"] = config[key]
    # What identifies these weights without hashing gigabytes: the config, names, sizes.
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in files[1:]:
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    modified = max(path.stat().st_mtime for path in files)
    return ModelCard(name, description.size_bytes, digest.hexdigest(), iso_time(modified),
                     details, info, _parameters(model_dir), model_dir)


def _parameters(model_dir: Path) -> str:
    path = model_dir / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(config, dict):
        return ""
    return "\n".join(f"{name:<30} {config[key]}" for key, name in _PARAMETER_KEYS.items()
                     if isinstance(config.get(key), int | float))


def iso_time(timestamp: float) -> str:
    """RFC 3339 in UTC, as Ollama writes its times."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")
