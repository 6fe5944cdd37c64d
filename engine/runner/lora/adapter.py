"""A PEFT adapter's weights, checked against the model, as host tensors per (layer, module).

PEFT names a tensor `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`
(A: [r, in]) and `...lora_B.weight` (B: [out, r]). kvdeck fuses q/k/v into `qkv_proj` and
gate/up into `gate_up_proj` (models/llama.py's `packed_modules`); each PEFT module is a
slice of one of the model's linear layers (`LoRATarget`). Every check (the rank, the target
modules, the layer count, each tensor's shape against the base's) runs on the safetensors
header before any weight is read.
"""

import re
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import nn

from kvdeck.engine.runner.models.linear import Linear
from kvdeck.engine.types.lora import ADAPTER_WEIGHTS, TARGET_MODULES, LoRAAdapterInfo, LoRARequest

# ...layers.N.<self_attn|mlp>.<module>.lora_<A|B>[.<adapter name>].weight
_TENSOR_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


@dataclass(slots=True, frozen=True)
class LoRATarget:
    """Where a PEFT module's delta lands: output slice `slice` of the layer's linear `linear`
    (a dotted path inside the decoder layer)."""

    linear: str
    slice: int
    in_size: int
    out_size: int


@dataclass(slots=True)
class HostAdapter:
    """An adapter's weights on the host: (layer, module) -> (A [r, in], B * scaling [out, r])."""

    request: LoRARequest
    info: LoRAAdapterInfo
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def rank(self) -> int:
        return self.info.rank


def model_targets(layer: nn.Module, packed_modules: dict[str, tuple[str, int]]) -> dict[str, LoRATarget]:
    """PEFT module name -> its place in one decoder layer, for the modules this model has."""
    linears = {name.rsplit(".", 1)[-1]: (name, module) for name, module in layer.named_modules()
               if isinstance(module, Linear)}
    targets = {}
    for module in TARGET_MODULES:
        merged, index = packed_modules.get(module, (module, 0))
        if merged not in linears:
            continue
        path, linear = linears[merged]
        targets[module] = LoRATarget(path, index, linear.input_size, linear.output_sizes[index])
    return targets


def load_adapter(request: LoRARequest, info: LoRAAdapterInfo, targets: dict[str, LoRATarget],
                 num_layers: int, max_rank: int, dtype: torch.dtype) -> HostAdapter:
    """Check the adapter against the model (ValueError naming the problem, nothing read
    before every check passed), then read its weights, B scaled."""
    name = request.lora_name
    if info.rank > max_rank:
        raise ValueError(f"LoRA adapter {name!r} has rank {info.rank}, above max_lora_rank {max_rank} "
                         "(raise --max-lora-rank)")
    missing = [m for m in info.target_modules if m not in targets]
    if missing:
        raise ValueError(f"LoRA adapter {name!r} targets {', '.join(missing)}, which this model does not "
                         f"have (it has {', '.join(targets)})")
    path = f"{info.path}/{ADAPTER_WEIGHTS}"
    try:
        with safe_open(path, framework="pt") as f:
            keys = _checked_keys(f, name, info, targets, num_layers)
            weights = {}
            for (layer, module), (a_key, b_key) in keys.items():
                a = f.get_tensor(a_key).to(dtype)
                b = (f.get_tensor(b_key).to(torch.float32) * info.scaling).to(dtype)
                weights[(layer, module)] = (a, b)
    except (OSError, RuntimeError) as exc:  # safetensors' errors for a broken file
        raise ValueError(f"LoRA adapter {name!r}: cannot read {path}: {exc}") from None
    return HostAdapter(request, info, weights)


def _checked_keys(f, name: str, info: LoRAAdapterInfo, targets: dict[str, LoRATarget],
                  num_layers: int) -> dict[tuple[int, str], tuple[str, str]]:
    """(layer, module) -> (A's key, B's key), every shape checked against the base."""
    found: dict[tuple[int, str], dict[str, str]] = {}
    for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
        match = _TENSOR_NAME.search(key)
        if match is None:
            raise ValueError(f"LoRA adapter {name!r} has a tensor kvdeck cannot apply: {key}")
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        if module not in targets:
            raise ValueError(f"LoRA adapter {name!r} has weights for {module}, which this model does not "
                             f"have ({key})")
        if layer >= num_layers:
            raise ValueError(f"LoRA adapter {name!r} has weights for layer {layer}; the base model has "
                             f"{num_layers} layers: it was made for another base model")
        target = targets[module]
        expected = (info.rank, target.in_size) if half == "A" else (target.out_size, info.rank)
        shape = tuple(f.get_slice(key).get_shape())
        if shape != expected:
            raise ValueError(f"LoRA adapter {name!r}: {key} has shape {shape}, this base model needs "
                             f"{expected}: it was made for another base model (or its rank is not r)")
        found.setdefault((layer, module), {})[half] = key
    if not found:
        raise ValueError(f"LoRA adapter {name!r} has no LoRA weights")
    for (layer, module), halves in found.items():
        if set(halves) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: layer {layer} {module} has lora_A or lora_B "
                             "but not both")
    return {place: (halves["A"], halves["B"]) for place, halves in found.items()}
