"""The quantisation a checkpoint implies, reconciled with the one asked for (the target's and
a draft model's config alike)."""

import dataclasses

from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.model_config import ModelConfig


def with_checkpoint_quantization(config: EngineConfig, model_config: ModelConfig) -> EngineConfig:
    """The config with the quantisation the checkpoint implies (a copy; ValueError when the
    asked-for method and the checkpoint disagree)."""
    method = (model_config.quantization_config or {}).get("quant_method")
    if method == "awq":
        if config.quantization not in (None, "awq"):
            raise ValueError(
                f"the checkpoint is AWQ-quantised; quantization={config.quantization!r} "
                "cannot be applied on top"
            )
        return dataclasses.replace(config, quantization="awq")
    if method is not None:
        raise ValueError(f"checkpoint quantisation {method!r} is not supported (supported: awq)")
    if config.quantization == "awq" and config.load_format != "dummy":
        raise ValueError(
            "quantization='awq' needs an AWQ checkpoint; quantise this model first with "
            "`kvdeck quantize MODEL --method awq`"
        )
    return config
