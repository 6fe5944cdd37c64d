"""The quantisation a checkpoint implies, reconciled with the one asked for (the target's and
a draft model's config alike)."""

import dataclasses

from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.model_config import ModelConfig

# Methods a checkpoint carries (its config.json's quantization_config.quant_method).
CHECKPOINT_METHODS = ("awq", "gptq")


def with_checkpoint_quantization(config: EngineConfig, model_config: ModelConfig) -> EngineConfig:
    """The config with the quantisation the checkpoint implies (a copy; ValueError when the
    asked-for method and the checkpoint disagree)."""
    method = (model_config.quantization_config or {}).get("quant_method")
    if method in CHECKPOINT_METHODS:
        if config.quantization not in (None, method):
            raise ValueError(
                f"the checkpoint is {method.upper()}-quantised; quantization={config.quantization!r} "
                "cannot be applied on top"
            )
        return dataclasses.replace(config, quantization=method)
    if method is not None:
        raise ValueError(f"checkpoint quantisation {method!r} is not supported (supported: "
                         f"{', '.join(CHECKPOINT_METHODS)})")
    if config.quantization in CHECKPOINT_METHODS and config.load_format != "dummy":
        hint = ("; quantise this model first with `kvdeck quantize MODEL --method awq`"
                if config.quantization == "awq" else "")
        raise ValueError(f"quantization={config.quantization!r} needs a {config.quantization.upper()} "
                         f"checkpoint{hint}")
    return config
