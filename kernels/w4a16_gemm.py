"""W4A16 GEMM on AutoAWQ's GEMM layout: y = x @ dequant(qweight, qzeros, scales) (+ bias).

Layout (AutoAWQ `WQLinear_GEMM`): `qweight` int32 [K, N/8] and `qzeros` int32 [K/G, N/8]
hold eight 4-bit values per int32; the value for output column 8*j + c sits at bits
4*i where AWQ_PACK_ORDER[i] == c. `scales` is [K/G, N]. w[k, n] = (q[k, n] - z[k//G, n]) *
s[k//G, n].

`w4a16_gemm_torch` (dequantise, then one matmul) is the reference and the CPU path. The
Triton implementation lives in `w4a16_gemm_triton.py`, imported only when a call needs it
(`triton.jit` decides compiled vs interpreted at import). `w4a16_gemm` picks one per call.
"""

import torch

from kvdeck.kernels.backends import KERNEL_BACKENDS

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Nibble index that holds column c of a pack: the inverse permutation of AWQ_PACK_ORDER,
# which is (c >> 1) + 4 * (c & 1) (the kernels compute it that way).
AWQ_UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
PACK_FACTOR = 8


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


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """`auto`: Triton on CUDA (the fused GEMM for small M, a device-side dequantise plus
    cuBLAS for large M), the torch reference elsewhere. `triton` forces the Triton path (on
    CPU it needs TRITON_INTERPRET=1), `torch` the reference."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"w4a16 backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return w4a16_gemm_torch(x, qweight, qzeros, scales, group_size, bias)
    from kvdeck.kernels.w4a16_gemm_triton import w4a16_gemm_triton

    return w4a16_gemm_triton(x, qweight, qzeros, scales, group_size, bias)
