"""The INT4 linear method for GPTQ checkpoints (AutoGPTQ's v1 layout, 4 bits), served through
the AWQ layers' kernels.

GPTQ stores qweight int32 [in/8, out] (eight consecutive input rows per int32, row 8i + j at
bits 4j), qzeros int32 [in/group, out/8] (eight consecutive columns per int32, the zero
point less one: v1's convention), scales [in/group, out] and, with act-order (`desc_act`),
g_idx [in]: the group of each input row, so a group's rows are scattered. Once loaded, the
layer is converted to AutoAWQ's layout: the rows sorted by group (the same permutation then
applies to the layer's input at every call, a gather), the nibbles in AWQ's order, the zero
points as they are. From there the AWQ method serves it: the CPU INT4 kernel (repacked into
its tiles), the Triton GEMM on CUDA (repacked at load for the `marlin` kernel, a symmetric
layer's zeros dropped), or the reference. A layer whose input is permuted stays
out of the CPU decoder stack, which reads its inputs as they come.
"""

from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Linear, copy_shard
from kvdeck.kernels.ops import PACK_FACTOR
from kvdeck.quant.awq_linear import AWQConfig, AWQLinearMethod
from kvdeck.quant.packing import pack_int4

GPTQ_PARAMS = ("qweight", "qzeros", "scales", "g_idx")
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class GPTQConfig:
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True

    @classmethod
    def from_quant_config(cls, quant_config: dict) -> "GPTQConfig":
        """Read config.json's `quantization_config`, refusing variants we cannot run."""
        bits = quant_config.get("bits", 4)
        group_size = quant_config.get("group_size", 128)
        checkpoint_format = str(quant_config.get("checkpoint_format", "gptq")).lower()
        if bits != 4:
            raise ValueError(f"quantization_config.bits must be 4 for GPTQ, got {bits!r}")
        if group_size not in GROUP_SIZES:
            raise ValueError(f"quantization_config.group_size must be one of {GROUP_SIZES} for GPTQ, got "
                             f"{group_size!r} (-1, one group per row, is not supported)")
        if checkpoint_format != "gptq":
            raise ValueError(f"quantization_config.checkpoint_format {checkpoint_format!r} is not supported; "
                             "kvdeck reads AutoGPTQ's 'gptq' (v1) layout")
        return cls(group_size=group_size, desc_act=bool(quant_config.get("desc_act", False)),
                   sym=bool(quant_config.get("sym", True)))


def unpack_rows(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ's qweight int32 [in/8, out] -> int32 [in, out] of 0..15 (row 8i + j at bits 4j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    values = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & 0xF  # [in/8, 8, out]
    return values.reshape(qweight.shape[0] * PACK_FACTOR, qweight.shape[1])


def unpack_columns(qzeros: torch.Tensor) -> torch.Tensor:
    """GPTQ's qzeros int32 [groups, out/8] -> int32 [groups, out] (column 8i + j at bits 4j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qzeros.device)
    values = (qzeros.unsqueeze(-1) >> shifts) & 0xF  # [groups, out/8, 8]
    return values.reshape(qzeros.shape[0], qzeros.shape[1] * PACK_FACTOR)


def to_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
           group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """GPTQ v1 tensors -> (AWQ qweight [in, out/8], qzeros [in/G, out/8], scales, the input
    permutation or None): w[k, n] = (q - z) s of the same weight, its rows sorted by group."""
    q = unpack_rows(qweight)
    in_features = q.shape[0]
    zeros = (unpack_columns(qzeros) + 1) & 0xF  # v1 stores z - 1 (a stored 15 is a zero of 0)
    permutation = None
    if g_idx is not None:
        groups = g_idx.long()
        if groups.shape != (in_features,) or groups.min() < 0 or groups.max() >= in_features // group_size:
            raise ValueError(f"g_idx must give each of the {in_features} input rows a group in "
                             f"0..{in_features // group_size - 1}")
        if not torch.equal(groups, torch.arange(in_features, device=groups.device) // group_size):
            permutation = torch.argsort(groups, stable=True)
            natural = torch.arange(in_features, device=groups.device) // group_size
            if not torch.equal(groups[permutation], natural):
                raise ValueError(f"g_idx must put {group_size} input rows in each group")
            q = q[permutation]
    return pack_int4(q), pack_int4(zeros), scales, permutation


class GPTQLinearMethod:
    """GPTQ's tensors while loading; AutoAWQ's (and the AWQ method's kernels) once loaded."""

    def __init__(self, config: GPTQConfig, backend: str = "auto") -> None:
        self.config = config
        self.awq = AWQLinearMethod(AWQConfig(group_size=config.group_size), backend)
        self.dense = self.awq.dense  # what stays dense (the runner sizes its copies)

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        group = self.config.group_size
        if layer.input_size % group or layer.input_size % PACK_FACTOR:
            raise ValueError(f"input size {layer.input_size} is not divisible by GPTQ group_size {group}")
        for size in layer.output_sizes:
            if size % PACK_FACTOR:
                raise ValueError(f"output size {size} is not a multiple of {PACK_FACTOR} (GPTQ zero packing)")
        k, n = layer.input_size, layer.output_size
        layer.qweight = nn.Parameter(torch.empty(k // PACK_FACTOR, n, dtype=torch.int32), requires_grad=False)
        layer.qzeros = nn.Parameter(torch.empty(k // group, n // PACK_FACTOR, dtype=torch.int32),
                                    requires_grad=False)
        layer.scales = nn.Parameter(torch.empty(k // group, n, dtype=dtype), requires_grad=False)
        # Without act-order the natural order; a checkpoint's own g_idx replaces it (not a
        # parameter: checkpoints without act-order may leave it out).
        layer.g_idx = torch.arange(k, dtype=torch.int32) // group
        layer.g_idx_loaded = False
        layer.int4 = None
        layer.repacked = None
        layer.input_permutation = None

    def load_weight(self, layer: Linear, param_name: str, tensor: torch.Tensor, shard_id: int | None) -> None:
        if param_name not in GPTQ_PARAMS:
            raise ValueError(f"unexpected parameter {param_name!r} for a GPTQ linear layer "
                             f"(expected one of {GPTQ_PARAMS})")
        if param_name == "g_idx":  # one per input row: every shard of a merged layer has the same
            if tensor.shape != layer.g_idx.shape:
                raise ValueError(f"g_idx of shape {tuple(tensor.shape)} does not fit "
                                 f"{tuple(layer.g_idx.shape)}")
            if layer.g_idx_loaded and not torch.equal(tensor.to(torch.int32), layer.g_idx):
                raise ValueError("the shards of a merged GPTQ layer must share one g_idx")
            layer.g_idx = tensor.to(torch.int32).clone()
            layer.g_idx_loaded = True
            return
        pack_factor = PACK_FACTOR if param_name == "qzeros" else 1
        copy_shard(getattr(layer, param_name), tensor, layer, shard_id, dim=1, pack_factor=pack_factor)

    def process_weights_after_loading(self, layer: Linear) -> None:
        qweight, qzeros, scales, permutation = to_awq(layer.qweight.data, layer.qzeros.data,
                                                      layer.scales.data, layer.g_idx,
                                                      self.config.group_size)
        layer.qweight = nn.Parameter(qweight, requires_grad=False)
        layer.qzeros = nn.Parameter(qzeros, requires_grad=False)
        layer.scales = nn.Parameter(scales, requires_grad=False)
        layer.input_permutation = permutation
        del layer.g_idx, layer.g_idx_loaded
        self.awq.process_weights_after_loading(layer)

    def output_head(self, lm_head: nn.Linear) -> nn.Module:
        return self.awq.output_head(lm_head)

    @staticmethod
    def _permuted(layer: Linear, x: torch.Tensor) -> torch.Tensor:
        """x's inputs in the order act-order's load permutation gave the weight's rows."""
        return x if layer.input_permutation is None else x.index_select(-1, layer.input_permutation)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return self.awq.apply(layer, self._permuted(layer, x))

    def fuses_activation(self, layer: Linear) -> bool:
        return self.awq.fuses_activation(layer)

    def apply_gated(self, layer: Linear, x: torch.Tensor, activation: str) -> torch.Tensor:
        return self.awq.apply_gated(layer, self._permuted(layer, x), activation)

    def unfuse_activation(self, layer: Linear) -> None:
        self.awq.unfuse_activation(layer)
