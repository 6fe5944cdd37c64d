"""Run an AWQ checkpoint through Hugging Face transformers with kvdeck's INT4 layers.

Every projection stored as qweight/qzeros/scales becomes kvdeck's `Linear`
(`kvdeck.engine.runner.models.linear`) with the AWQ linear method (the same code the
engine runs), inside the transformers model of the checkpoint's architecture; everything
else loads as dense tensors. Used by `kvdeck eval-ppl` for AWQ checkpoints and by the tests
as an independent host for the INT4 layers.
"""

import contextlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from kvdeck.engine.runner.models.linear import Linear
from kvdeck.quant.awq_linear import AWQ_PARAMS, AWQConfig, AWQLinearMethod


class _HFLinearAdapter(nn.Module):
    """Holds a kvdeck Linear where transformers expects an nn.Linear."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        path = model_dir / name
        if not path.is_file():
            raise ValueError(f"{str(model_dir)!r} has no {name} (only safetensors are loaded)")
        tensors.update(load_file(path))
    return tensors


def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def load_awq_into_transformers(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
) -> nn.Module:
    """A transformers causal LM whose quantised projections run kvdeck's AWQ linear method."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    quant_config = getattr(config, "quantization_config", None)
    if not quant_config:
        raise ValueError(f"{str(model_dir)!r} has no quantization_config in config.json")
    quant_config = quant_config if isinstance(quant_config, dict) else quant_config.to_dict()
    if quant_config.get("quant_method") != "awq":
        raise ValueError(
            f"quantization_config.quant_method is {quant_config.get('quant_method')!r}, not 'awq'"
        )
    method = AWQLinearMethod(AWQConfig.from_quant_config(quant_config), backend=backend)
    # transformers would hand an AWQ config to its own (optional) AWQ integration.
    del config.quantization_config
    with _no_init():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tensors = read_safetensors(model_dir)
    prefixes = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".qweight")})
    for prefix in prefixes:
        dense = model.get_submodule(prefix)
        if not isinstance(dense, nn.Linear):
            raise ValueError(f"{prefix} holds AWQ tensors but is not a linear layer")
        linear = Linear(dense.in_features, [dense.out_features], dense.bias is not None,
                        method, dtype)
        for suffix in AWQ_PARAMS:
            linear.load_weight(suffix, tensors.pop(f"{prefix}.{suffix}"), None)
        if dense.bias is not None:
            linear.load_weight("bias", tensors.pop(f"{prefix}.bias"), None)
        method.process_weights_after_loading(linear)
        parent_name, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _HFLinearAdapter(linear))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise ValueError(f"checkpoint tensors the model does not have: {unexpected[:5]}")
    tied = getattr(config, "tie_word_embeddings", False)
    replaced = tuple(f"{prefix}." for prefix in prefixes)
    missing = [
        k for k in missing if not k.startswith(replaced) and not (tied and k == "lm_head.weight")
    ]
    if missing:
        raise ValueError(f"checkpoint lacks tensors: {missing[:5]}")
    if tied:
        model.tie_weights()
    return model.to(device).eval()
