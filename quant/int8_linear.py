"""Weight-only INT8 (`quantization="int8"`): a dense checkpoint quantised at load time,
symmetric, one scale per output channel; activations stay in the model's dtype.

Made for CPU decode, where a step's time is the bytes of weights read: a quarter of fp32's
(kernels/cpu/linear.py has the kernels and the measurements). The output projection is
quantised the same way (as llama.cpp's q8_0 does); the input embedding stays dense, since a
step reads only one row of it per token.
"""

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Linear, copy_shard
from kvdeck.kernels.cpu.linear import int8_linear, quantize_int8


class Int8LinearMethod:
    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        # Dense until the checkpoint (or the dummy loader) has filled it.
        layer.weight = nn.Parameter(
            torch.empty(layer.output_size, layer.input_size, dtype=dtype), requires_grad=False
        )

    def load_weight(
        self, layer: Linear, param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None:
        if param_name != "weight":
            raise ValueError(f"unexpected parameter {param_name!r} for an int8 layer: it quantises "
                             "a dense checkpoint at load time")
        if not hasattr(layer, "weight"):
            raise ValueError("int8 layer was already quantised; cannot load more weights")
        copy_shard(layer.weight, tensor, layer, shard_id, dim=0)

    def process_weights_after_loading(self, layer: Linear) -> None:
        if not hasattr(layer, "weight"):
            return
        qweight, scales = quantize_int8(layer.weight.data)
        del layer.weight
        layer.qweight = nn.Parameter(qweight, requires_grad=False)
        layer.scales = nn.Parameter(scales.to(torch.bfloat16), requires_grad=False)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, layer.qweight, layer.scales, layer.bias)

    def output_head(self, lm_head: nn.Linear) -> nn.Module:
        return Int8OutputHead(lm_head.weight.data)


class Int8OutputHead(nn.Module):
    """The output projection on an int8 copy of its weight (tied, the embedding stays dense)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        qweight, scales = quantize_int8(weight)
        self.qweight = nn.Parameter(qweight, requires_grad=False)
        self.scales = nn.Parameter(scales.to(torch.bfloat16), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return int8_linear(hidden, self.qweight, self.scales)
