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
           "quantize_activations_q8", "unpack_int4", "w4a16_gemm_q8_torch", "w4a16_gemm_torch"]


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



def quantize_activations_q8(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x8 [M, K] int8-valued fp32, scales [M, K/block] fp32) with x ~= x8 * scale,
    per block of `block` values: scale = amax / 127, x8 = round-half-even(x * (127 / amax))
    (0 where amax is 0). The CPU INT4 kernel's operations, so its x8 and scales exactly."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, k // block, block)
    amax = blocks.abs().amax(dim=-1)
    # A true division, as the kernel's (127.0 / tensor would be a reciprocal times 127).
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    x8 = torch.round(blocks * inverse.unsqueeze(-1)).clamp_(-127, 127)
    return x8.reshape(rows, k), amax / 127.0


def w4a16_gemm_q8_torch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """What the CPU INT4 kernel computes: the activations quantised to int8 per block of 32
    (`quantize_activations_q8`), then the dequantised product in fp32, in x's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    x8, block_scales = quantize_activations_q8(flat)
    activations = (x8.view(flat.shape[0], -1, 32) * block_scales.unsqueeze(-1)).reshape(flat.shape)
    out = activations @ dequantize_awq(qweight, qzeros, scales.float(), group_size)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])
