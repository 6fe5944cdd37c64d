"""Linear layers whose weight storage is decided by a `LinearMethod`.

Projections that the checkpoint stores separately (q/k/v, gate/up) are merged
into one layer with several output shards, so one GEMM serves them. The method
decides which parameters exist (a dense `weight`, or AWQ's `qweight`/`qzeros`/
`scales`, ...) and how a checkpoint tensor is copied into shard `shard_id`.
"""

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from kvdeck.engine.types.quantization import make_linear_method
from kvdeck.kernels.cpu import int8 as cpu_int8
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.linear import bf16_packing_supported, pack_bf16_weight, packed_linear


class LinearMethod(Protocol):
    def create_weights(self, layer: "Linear", dtype: torch.dtype) -> None: ...

    def load_weight(
        self, layer: "Linear", param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None: ...

    def process_weights_after_loading(self, layer: "Linear") -> None: ...

    def apply(self, layer: "Linear", x: torch.Tensor) -> torch.Tensor: ...

    # Optional: `output_head(lm_head) -> nn.Module`, the output projection as this method
    # runs it (called once the weights are loaded; the input embedding stays as it is).
    # Optional, for a `gated` layer: `fuses_activation(layer) -> bool` (the weights are laid
    # out so the product's epilogue applies the MLP's activation), `apply_gated(layer, x,
    # activation)` (that product: act(gate) * up) and `unfuse_activation(layer)` (the layout
    # back to a plain product's, before a LoRA adapter adds to the gate | up output).


class Linear(nn.Module):
    """y = x W^T (+ b), with W made of `output_sizes` shards stacked on the output dim."""

    lora = None  # LoRA adapters' slots (engine/runner/lora/slots.py), set with enable_lora

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        method: "LinearMethod",
        dtype: torch.dtype,
        gated: bool = False,
    ) -> None:
        super().__init__()
        self.gated = gated  # gate | up halves that a gated activation (an MLP's) consumes
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.shard_offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        self.method = method
        self.packed_number: int | None = None  # a packed bf16 weight's (kernels/cpu/linear.py)
        self.dense_weight: torch.Tensor | None = None  # its row-major copy (kernels/cpu/native.py)
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
        if self.lora is not None:  # the step's adapter rows add their deltas
            return self.lora.apply(x, self.base_forward)
        return self.method.apply(self, x)

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The product without adapters."""
        return self.method.apply(self, x)

    def act_and_mul(self, x: torch.Tensor, activation: str,
                    unfused: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """act(gate) * up of this gated layer's product (`activation`: "silu" or "gelu_tanh";
        `unfused` the ops' function for it): by the product's own epilogue where the method
        laid the weights out for that (one launch fewer), else `unfused` on the product."""
        if self.lora is None and self.fuses_activation():
            return self.method.apply_gated(self, x, activation)
        return unfused(self.forward(x))

    def fuses_activation(self) -> bool:
        fuses = getattr(self.method, "fuses_activation", None)
        return fuses is not None and fuses(self)

    def attach_lora(self, slots) -> None:
        """Adapters' slots for this layer (engine/runner/lora/slots.py): their deltas add to
        the plain product, so a fused activation's layout is undone first."""
        if self.fuses_activation():
            self.method.unfuse_activation(self)
        self.lora = slots


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
    """A dense weight of shape [output_size, input_size], applied with one matmul. A bf16
    weight on a CPU with native bf16 is packed once for oneDNN (kernels/cpu/linear.py);
    with `small_batch_gemv` (set by the runner) the row-major weight is kept as well, and
    steps of at most cpu_native.GEMV_MAX_ROWS rows (a single chat's decode) read it through
    kernels/cpu/native.py, which streams weights faster than oneDNN does for one row."""

    small_batch_gemv = False

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
        if _packs_on_cpu(layer.weight):
            dense = layer.weight.data
            layer.weight, layer.packed_number = pack_bf16_weight(dense)
            if self.small_batch_gemv:
                layer.dense_weight = dense

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        # The packed weight by number: a compiled graph must not touch the mkldnn tensor.
        if layer.packed_number is not None:
            if layer.dense_weight is not None and cpu_native.gemv_takes(x):
                return cpu_native.small_batch_linear(x, layer.dense_weight, layer.bias)
            return packed_linear(x, layer.packed_number, layer.output_size, layer.bias)
        return nn.functional.linear(x, layer.weight, layer.bias)

    def output_head(self, lm_head: nn.Linear) -> nn.Module:
        weight = lm_head.weight
        if (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.is_contiguous()
                and lm_head.bias is None and cpu_native.available()):
            return SmallBatchOutputHead(weight)
        if not _packs_on_cpu(weight):
            return lm_head
        return PackedOutputHead(weight, keep_dense=self.small_batch_gemv)


class SmallBatchOutputHead(nn.Module):
    """An fp32 output projection whose steps of few rows (a chat's decode, a few requests';
    `max_rows`: cpu_native.f32_gemv_max_rows, 64 for a head in the last-level cache, else 8)
    take the native fp32 GEMV: torch's fp32 matmul of one row took about a third of the
    demo's decode step for its 4096 x 256 head (114 us against 43). Larger steps stay
    torch's."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # tied: the input embedding's own tensor, not a copy
        self.max_rows = cpu_native.f32_gemv_max_rows(weight.numel() * weight.element_size())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if cpu_native.gemv_takes(hidden, self.max_rows) and not torch.compiler.is_compiling():
            return cpu_native.f32_gemv(hidden, self.weight)
        return nn.functional.linear(hidden, self.weight)


class PackedOutputHead(nn.Module):
    """The output projection on a packed bf16 copy of its weight (which, tied, is also the
    input embedding: that one stays dense for its row lookups, and the GEMV kernel reads
    it for a step of few rows)."""

    def __init__(self, weight: torch.Tensor, keep_dense: bool = False) -> None:
        super().__init__()
        self.weight, self.packed_number = pack_bf16_weight(weight.data)
        self.dense_weight = weight.data if keep_dense else None
        # as many rows as the decoder stack takes: each row's logits are a one-row step's
        self.gemv_max_rows = cpu_native.BF16_STACK_MAX_ROWS

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.dense_weight is not None and cpu_native.gemv_takes(hidden, self.gemv_max_rows):
            return cpu_native.small_batch_linear(hidden, self.dense_weight, None)
        return packed_linear(hidden, self.packed_number, self.weight.shape[0])


class Int8OutputHead(nn.Module):
    """An output projection in int8 on the CPU (llama.cpp's Q8_0 form, kernels/cpu/int8.py),
    for INT4 models: in bf16 SmolLM2's head is as many bytes as its INT4 layers together,
    and llama.cpp's Q4 files keep theirs at Q8_0. Its activations are quantised to int8 per
    block of 32 as the INT4 layers' are."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # tied: the input embedding's own tensor (its rows are looked up)
        self.tiles = cpu_int8.from_dense(weight.data)

    @staticmethod
    def takes(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        return (bias is None and weight.device.type == "cpu"
                and weight.dtype in (torch.bfloat16, torch.float32) and cpu_int8.available()
                and cpu_int8.takes(weight))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a compiled graph cannot trace the ctypes call
            return nn.functional.linear(hidden, self.weight)
        return cpu_int8.gemm(hidden.contiguous(), self.tiles)


def _packs_on_cpu(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and bf16_packing_supported()


def get_linear_method(quantization: str | None, quant_config: dict | None) -> LinearMethod:
    """The method for every decoder-layer projection (embeddings and lm_head stay dense)."""
    if quantization is None:
        return UnquantizedLinearMethod()
    return make_linear_method(quantization, quant_config or {})
