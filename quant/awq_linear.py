"""The INT4 linear method for AWQ checkpoints (AutoAWQ GEMM layout).

Parameters per layer: qweight int32 [in, out/8], qzeros int32 [in/group, out/8] and
scales [in/group, out] (model dtype). Merged layers (qkv, gate/up) hold their shards
side by side along the output dim, which is dim 1 here; each shard is a whole number of
int32 packs, so a shard copies as a plain slice.

Where the layers sit on a CPU with the INT4 kernels (kernels/cpu/int4.py) and the backend
is "auto", the weights are repacked once loaded into that kernel's tiles (the AutoAWQ
tensors are then dropped: the tiles are the weights) and every product runs it, at any
number of rows: it beats dequantise-then-matmul at every size and oneDNN's bf16 GEMM from
one row to 512 (benchmarks/bench_cpu_int4.py). Its activations are quantised to int8 per
block of 32 (`w4a16_gemm_q8_torch` is its reference). Elsewhere, dispatch's `w4a16_gemm`.

On CUDA with the `marlin` W4A16 kernel (KVDECK_W4A16_KERNEL, `kernels.dispatch.w4a16_kernel`),
the weights are repacked once loaded into that kernel's layout (kernels/reference/
w4a16_repack.py: eight input rows per int32 in column tiles, zeros as bytes or none for a
symmetric layer); qweight, qzeros and scales then hold the repacked tensors and `layer.repacked`
describes them. The checkpoint's format is unchanged. With backend "triton" the same happens
on the CPU (the kernel under TRITON_INTERPRET=1, as tests run it). A gate | up layer (`gated`,
no bias) is repacked with its gate and up columns paired (`pair_halves`), so the GEMM's epilogue
applies the MLP's activation (`apply_gated`: one activation launch fewer a layer); KVDECK_FUSED_ACTIVATION=0
keeps the plain layout, and a LoRA adapter on the layer undoes the pairing (`unfuse_activation`).
"""

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Int8OutputHead, Linear, UnquantizedLinearMethod, copy_shard
from kvdeck.kernels.cpu import int4 as cpu_int4
from kvdeck.kernels.dispatch import w4a16_gated_repacked, w4a16_gemm, w4a16_gemm_repacked, w4a16_kernel
from kvdeck.kernels.ops import KERNEL_BACKENDS, PACK_FACTOR, env_switch
from kvdeck.kernels.reference.w4a16_repack import RepackedW4, pair_halves, repack_awq, unpair_halves
from kvdeck.quant.int8_head import W8A16OutputHead, int8_head_setting

logger = logging.getLogger(__name__)

AWQ_PARAMS = ("qweight", "qzeros", "scales")
FUSED_ACTIVATION_ENV = "KVDECK_FUSED_ACTIVATION"


def fused_activation_setting(environ=os.environ) -> bool:
    """KVDECK_FUSED_ACTIVATION: 1 (the default) has a repacked gate | up layer's GEMM apply the
    MLP's activation in its epilogue, 0 keeps the separate activation kernel (to measure)."""
    return env_switch(FUSED_ACTIVATION_ENV, True, environ)


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
    """INT4 weights: the Triton GEMM on CUDA, the INT4 tiles' kernel on a CPU that has it,
    dequantise-then-matmul otherwise (and with backend "torch", the reference)."""

    def __init__(self, config: AWQConfig, backend: str = "auto") -> None:
        if backend not in KERNEL_BACKENDS:
            raise ValueError(f"w4a16_backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
        self.config = config
        self.backend = backend
        # Read as the model is built, so a bad value stops any INT4 load, not only a CUDA one.
        self.fuse_activation = fused_activation_setting()
        # What stays dense (the output head, where it is not int8): on a bf16 CPU it takes the
        # unquantised method's packed weight and small-batch GEMV.
        self.dense = UnquantizedLinearMethod()

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
        layer.int4 = None  # the CPU kernel's tiles, once repacked
        layer.repacked = None  # the CUDA layout of the `marlin` kernel, once repacked

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
        if self._repacks_for_cuda(layer):
            self._repack_for_cuda(layer)
            return
        if self.backend != "auto" or layer.qweight.device.type != "cpu" or not cpu_int4.available():
            return
        why = cpu_int4.why_not_repackable(layer.input_size, layer.output_size, self.config.group_size,
                                          layer.scales)
        if why is not None:
            logger.info("INT4 layer stays on dequantise-then-matmul: %s", why)
            return
        layer.int4 = cpu_int4.repack_awq(layer.qweight.data, layer.qzeros.data, layer.scales.data,
                                         self.config.group_size)
        for name in AWQ_PARAMS:  # the tiles hold the weights now
            setattr(layer, name, nn.Parameter(getattr(layer, name).data.new_empty(0), requires_grad=False))

    def _repacks_for_cuda(self, layer: Linear) -> bool:
        on_cuda = layer.qweight.device.type == "cuda" and self.backend != "torch"
        return (on_cuda or self.backend == "triton") and w4a16_kernel() == "marlin"

    def _repack_for_cuda(self, layer: Linear) -> None:
        repacked = repack_awq(layer.qweight.data, layer.qzeros.data, layer.scales.data,
                              self.config.group_size)
        if layer.gated and layer.bias is None and self.fuse_activation:
            repacked = pair_halves(repacked)
        self._hold_repacked(layer, repacked)

    @staticmethod
    def _hold_repacked(layer: Linear, repacked: RepackedW4) -> None:
        zeros = repacked.zeros
        if zeros is None:  # symmetric: the kernel folds the zero point in
            zeros = repacked.qweight.new_empty(0, dtype=torch.uint8)
        # Parameters still, so the model's weight bytes count them.
        layer.qweight = nn.Parameter(repacked.qweight, requires_grad=False)
        layer.qzeros = nn.Parameter(zeros, requires_grad=False)
        layer.scales = nn.Parameter(repacked.scales, requires_grad=False)
        layer.repacked = repacked

    def output_head(self, lm_head: nn.Linear) -> nn.Module:
        """Where the INT4 layers run a kernel (the CPU's, or Triton's on a GPU) the head takes
        int8 (as llama.cpp's Q4 files keep it at Q8_0; quant/int8_head.py); elsewhere, or with
        KVDECK_INT8_HEAD=0, it stays dense (AutoAWQ leaves it so)."""
        weight, bias = lm_head.weight, lm_head.bias
        if not int8_head_setting():
            return self.dense.output_head(lm_head)
        if self.backend == "auto" and cpu_int4.available() and Int8OutputHead.takes(weight, bias):
            return Int8OutputHead(weight)
        on_gpu_kernel = (weight.device.type == "cuda" and self.backend != "torch") or self.backend == "triton"
        if on_gpu_kernel and W8A16OutputHead.takes(weight, bias):
            return W8A16OutputHead(weight, self.backend)
        return self.dense.output_head(lm_head)

    def fuses_activation(self, layer: Linear) -> bool:
        repacked = getattr(layer, "repacked", None)
        return repacked is not None and repacked.paired

    def apply_gated(self, layer: Linear, x: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up of a paired layer's product, the activation in the GEMM's epilogue."""
        lead = x.shape[:-1]
        out = w4a16_gated_repacked(x.reshape(-1, x.shape[-1]), layer.repacked, activation,
                                   backend=self.backend)
        return out.reshape(*lead, out.shape[-1])

    def unfuse_activation(self, layer: Linear) -> None:
        if self.fuses_activation(layer):
            self._hold_repacked(layer, unpair_halves(layer.repacked))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.int4 is not None:
            return cpu_int4.gemm(x, layer.int4, layer.bias)
        lead = x.shape[:-1]
        if getattr(layer, "repacked", None) is not None:
            out = w4a16_gemm_repacked(x.reshape(-1, x.shape[-1]), layer.repacked, layer.bias,
                                      backend=self.backend)
            return out.reshape(*lead, out.shape[-1])
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
