"""W4A16 GEMM on AutoAWQ's GEMM layout, the torch reference: y = x @ dequant(qweight, qzeros,
scales) (+ bias).

Layout (AutoAWQ `WQLinear_GEMM`): `qweight` int32 [K, N/8] and `qzeros` int32 [K/G, N/8]
hold eight 4-bit values per int32; the value for output column 8*j + c sits at bits
4*i where AWQ_PACK_ORDER[i] == c (kernels/ops.py). `scales` is [K/G, N]. w[k, n] =
(q[k, n] - z[k//G, n]) * s[k//G, n].

`w4a16_gemm_torch` dequantises, then runs one matmul. The Triton GEMM is
kernels/triton/w4a16_gemm.py, the CPU's kernels/cpu/int4.py; `kernels.dispatch.w4a16_gemm`
picks one per call.
"""

import torch

from kvdeck.kernels.ops import AWQ_PACK_ORDER, AWQ_UNPACK_ORDER, PACK_FACTOR

__all__ = ["AWQ_PACK_ORDER", "AWQ_UNPACK_ORDER", "PACK_FACTOR", "awq_shifts", "dequantize_awq",
           "unpack_int4", "w4a16_gemm_torch"]


def awq_shifts(device: torch.device) -> torch.Tensor:
    """Bit offset of column c (0..7) inside its int32, made on `device` from an arange: a
    host tensor here would be a synchronous copy per call, which CUDA graphs cannot capture."""
    column = torch.arange(PACK_FACTOR, dtype=torch.int32, device=device)
    return ((column >> 1) + ((column & 1) << 2)) * 4


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] in AWQ order -> int32 [R, C] of values 0..15 in natural column order."""
    # Arithmetic shift of a negative int32 is fine: the mask keeps only the nibble.
    values = (packed.unsqueeze(-1) >> awq_shifts(packed.device)) & 0xF
    return values.reshape(packed.shape[0], packed.shape[1] * PACK_FACTOR)


def dequantize_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The dense weight [K, N] (dtype of `scales`) that the packed tensors stand for."""
    k = qweight.shape[0]
    num_groups, n = scales.shape
    # Rows of one group share zeros and scales: broadcast over a [groups, G, N] view.
    q = unpack_int4(qweight).view(num_groups, group_size, n)
    z = unpack_int4(qzeros).unsqueeze(1)
    return ((q - z).to(scales.dtype) * scales.unsqueeze(1)).view(k, n)


def w4a16_gemm_torch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    weight = dequantize_awq(qweight, qzeros, scales, group_size).to(x.dtype)
    out = x @ weight
    return out if bias is None else out + bias

