"""Group-wise asymmetric INT4 quantisation and AutoAWQ's GEMM packing.

A weight W [out, in] is cut into groups of `group_size` consecutive input channels; each
(output row, group) gets a scale and an integer zero point so that
w ~= (q - z) * s with q, z in 0..15. The GEMM layout stores the transpose: qweight int32
[in, out/8], qzeros int32 [in/group, out/8], scales [in/group, out]. Unpacking lives next
to the kernel that consumes it (kernels/reference/w4a16_gemm.py).
"""

import torch

from kvdeck.kernels.ops import AWQ_PACK_ORDER, PACK_FACTOR
from kvdeck.kernels.reference.w4a16_gemm import unpack_int4

MAX_INT4 = 15


def quantize_groups(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [out, in] -> (q int32 [out, in], scales [out, in/group], zeros int32 [out, in/group]).

    Same rounding as AutoAWQ's `pseudo_quantize_tensor`, so our checkpoints and theirs agree.
    """
    out_features, in_features = weight.shape
    if in_features % group_size != 0:
        raise ValueError(
            f"input dimension {in_features} is not divisible by group_size {group_size}"
        )
    w = weight.float().reshape(-1, group_size)
    max_val = w.amax(dim=1, keepdim=True)
    min_val = w.amin(dim=1, keepdim=True)
    scales = (max_val - min_val).clamp(min=1e-5) / MAX_INT4
    zeros = (-torch.round(min_val / scales)).clamp(0, MAX_INT4)
    q = (torch.round(w / scales) + zeros).clamp(0, MAX_INT4)
    return (
        q.to(torch.int32).reshape(out_features, in_features),
        scales.reshape(out_features, -1),
        zeros.to(torch.int32).reshape(out_features, -1),
    )


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Quantise and dequantise in one go (what the scale and clip searches score)."""
    q, scales, zeros = quantize_groups(weight, group_size)
    shape = weight.shape
    w = (q.reshape(-1, group_size) - zeros.reshape(-1, 1)).float() * scales.reshape(-1, 1)
    return w.reshape(shape).to(weight.dtype)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] of 0..15 in natural column order -> int32 [R, C/8] in AWQ pack order."""
    rows, cols = values.shape
    if cols % PACK_FACTOR != 0:
        raise ValueError(f"cannot pack {cols} columns: not a multiple of {PACK_FACTOR}")
    v = values.to(torch.int64).reshape(rows, cols // PACK_FACTOR, PACK_FACTOR)
    packed = torch.zeros(rows, cols // PACK_FACTOR, dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(AWQ_PACK_ORDER):
        packed |= (v[:, :, column] & MAX_INT4) << (4 * nibble)
    # Values >= 2**31 are the negative int32 with the same bits.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def pack_awq_weight(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense W [out, in] -> (qweight int32 [in, out/8], qzeros int32 [in/g, out/8], scales fp16)."""
    out_features = weight.shape[0]
    if out_features % PACK_FACTOR != 0:
        raise ValueError(
            f"output dimension {out_features} is not a multiple of {PACK_FACTOR} (AWQ packing)"
        )
    q, scales, zeros = quantize_groups(weight, group_size)
    qweight = pack_int4(q.t().contiguous())
    qzeros = pack_int4(zeros.t().contiguous())
    return qweight, qzeros, scales.t().contiguous().to(torch.float16)


__all__ = [
    "MAX_INT4",
    "fake_quantize",
    "pack_awq_weight",
    "pack_int4",
    "quantize_groups",
    "unpack_int4",
]
