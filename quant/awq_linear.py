"""The INT4 linear method for AWQ checkpoints (AutoAWQ GEMM layout).

Parameters per layer: qweight int32 [in, out/8], qzeros int32 [in/group, out/8] and
scales [in/group, out] (model dtype). Merged layers (qkv, gate/up) hold their shards
side by side along the output dim, which is dim 1 here; each shard is a whole number of
int32 packs, so a shard copies as a plain slice.
"""

from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Linear, copy_shard
from kvdeck.kernels.dispatch import w4a16_gemm
from kvdeck.kernels.ops import KERNEL_BACKENDS, PACK_FACTOR

AWQ_PARAMS = ("qweight", "qzeros", "scales")


@dataclass(frozen=True, slots=True)
class AWQConfig:
    group_size: int = 128
    bits: int = 4
    zero_point: bool = True
    version: str = "gemm"

    @classmethod
    def from_quant_config(cls, quant_config: dict) -> "AWQConfig":
        """Read config.json's `quantization_config`, refusing variants we cannot run."""
        bits = quant_config.get("bits", quant_config.get("w_bit", 4))
        group_size = quant_config.get("group_size", quant_config.get("q_group_size", 128))
        zero_point = quant_config.get("zero_point", True)
        version = str(quant_config.get("version", "gemm")).lower()
        if bits != 4:
            raise ValueError(f"quantization_config.bits must be 4 for AWQ, got {bits!r}")
        if not isinstance(group_size, int) or group_size <= 0 or group_size % 16 != 0:
            raise ValueError(
                f"quantization_config.group_size must be a positive multiple of 16, "
                f"got {group_size!r}"
            )
        if zero_point is not True:
            raise ValueError("quantization_config.zero_point must be true (asymmetric AWQ)")
        if version != "gemm":
            raise ValueError(
                f"quantization_config.version {version!r} is not supported; kvdeck reads "
                "AutoAWQ's 'gemm' layout"
            )
        return cls(group_size=group_size, bits=bits, zero_point=zero_point, version=version)


class AWQLinearMethod:
    """INT4 weights, dequantised inside the Triton GEMM on CUDA, before a matmul on CPU."""

    def __init__(self, config: AWQConfig, backend: str = "auto") -> None:
        if backend not in KERNEL_BACKENDS:
            raise ValueError(f"w4a16_backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
        self.config = config
        self.backend = backend

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        group = self.config.group_size
        if layer.input_size % group != 0:
            raise ValueError(
                f"input size {layer.input_size} is not divisible by AWQ group_size {group}"
            )
        for size in layer.output_sizes:
            if size % PACK_FACTOR != 0:
                raise ValueError(
                    f"output size {size} is not a multiple of {PACK_FACTOR} (AWQ int4 packing)"
                )
        packed_out = layer.output_size // PACK_FACTOR
        num_groups = layer.input_size // group
        # Random int32s (load_format="dummy") are valid: every bit pattern is eight nibbles.
        layer.qweight = nn.Parameter(
            torch.empty(layer.input_size, packed_out, dtype=torch.int32), requires_grad=False
        )
        layer.qzeros = nn.Parameter(
            torch.empty(num_groups, packed_out, dtype=torch.int32), requires_grad=False
        )
        layer.scales = nn.Parameter(
            torch.empty(num_groups, layer.output_size, dtype=dtype), requires_grad=False
        )

    def load_weight(
        self, layer: Linear, param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None:
        if param_name not in AWQ_PARAMS:
            raise ValueError(
                f"unexpected parameter {param_name!r} for an AWQ linear layer "
                f"(expected one of {AWQ_PARAMS})"
            )
        pack_factor = 1 if param_name == "scales" else PACK_FACTOR
        copy_shard(getattr(layer, param_name), tensor, layer, shard_id, dim=1,
                   pack_factor=pack_factor)

    def process_weights_after_loading(self, layer: Linear) -> None:
        pass

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = w4a16_gemm(
            x.reshape(-1, x.shape[-1]),
            layer.qweight,
            layer.qzeros,
            layer.scales,
            self.config.group_size,
            layer.bias,
            backend=self.backend,
        )
        return out.reshape(*lead, out.shape[-1])
