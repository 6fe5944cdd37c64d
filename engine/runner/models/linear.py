"""Linear layers whose weight storage is decided by a `LinearMethod`.

Projections that the checkpoint stores separately (q/k/v, gate/up) are merged
into one layer with several output shards, so one GEMM serves them. The method
decides which parameters exist (a dense `weight`, or AWQ's `qweight`/`qzeros`/
`scales`, ...) and how a checkpoint tensor is copied into shard `shard_id`.
"""

from typing import Protocol

import torch
from torch import nn

from kvdeck.engine.types.quantization import make_linear_method


class LinearMethod(Protocol):
    def create_weights(self, layer: "Linear", dtype: torch.dtype) -> None: ...

    def load_weight(
        self, layer: "Linear", param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None: ...

    def process_weights_after_loading(self, layer: "Linear") -> None: ...

    def apply(self, layer: "Linear", x: torch.Tensor) -> torch.Tensor: ...


class Linear(nn.Module):
    """y = x W^T (+ b), with W made of `output_sizes` shards stacked on the output dim."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        method: "LinearMethod",
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.shard_offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        self.method = method
        self.bias = (
            nn.Parameter(torch.zeros(self.output_size, dtype=dtype), requires_grad=False) if bias else None
        )
        method.create_weights(self, dtype)

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard_id: int | None) -> None:
        if param_name == "bias" and self.bias is not None:
            copy_shard(self.bias, tensor, self, shard_id, dim=0)
            return
        self.method.load_weight(self, param_name, tensor, shard_id)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)


def copy_shard(
    param: torch.Tensor,
    tensor: torch.Tensor,
    layer: Linear,
    shard_id: int | None,
    dim: int,
    pack_factor: int = 1,
) -> None:
    """Copy `tensor` into the slice of `param` that holds output shard `shard_id`.

    `pack_factor` divides the offsets when several outputs share one stored element
    (AWQ packs 8 int4 values into one int32 along the output dim).
    """
    if shard_id is None:
        target = param
    else:
        start = layer.shard_offsets[shard_id] // pack_factor
        size = layer.output_sizes[shard_id] // pack_factor
        target = param.narrow(dim, start, size)
    if target.shape != tensor.shape:
        raise ValueError(
            f"checkpoint tensor of shape {tuple(tensor.shape)} does not fit parameter slice "
            f"of shape {tuple(target.shape)}"
        )
    target.copy_(tensor.to(target.dtype))


class UnquantizedLinearMethod:
    """A dense weight of shape [output_size, input_size], applied with one matmul."""

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(
            torch.empty(layer.output_size, layer.input_size, dtype=dtype), requires_grad=False
        )

    def load_weight(
        self, layer: Linear, param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None:
        if param_name != "weight":
            raise ValueError(f"unexpected parameter {param_name!r} for an unquantised linear layer")
        copy_shard(layer.weight, tensor, layer, shard_id, dim=0)

    def process_weights_after_loading(self, layer: Linear) -> None:
        pass

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, layer.weight, layer.bias)


def get_linear_method(quantization: str | None, quant_config: dict | None) -> LinearMethod:
    """The method for every decoder-layer projection (embeddings and lm_head stay dense)."""
    if quantization is None:
        return UnquantizedLinearMethod()
    return make_linear_method(quantization, quant_config or {})
