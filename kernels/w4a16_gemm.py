"""W4A16 GEMM on AutoAWQ's GEMM layout: y = x @ dequant(qweight, qzeros, scales) (+ bias).

Layout (AutoAWQ `WQLinear_GEMM`): `qweight` int32 [K, N/8] and `qzeros` int32 [K/G, N/8]
hold eight 4-bit values per int32; the value for output column 8*j + c sits at bits
4*i where AWQ_PACK_ORDER[i] == c. `scales` is [K/G, N]. w[k, n] = (q[k, n] - z[k//G, n]) *
s[k//G, n].

`w4a16_gemm_torch` (dequantise, then one matmul) is the reference and the CPU path.
`w4a16_gemm_triton` dequantises tiles inside the GEMM so the weight crosses memory as
int4 (the win at small M, where the GEMM is memory bound); fp32 accumulation, and split-K
so that a handful of tokens still fills the GPU. `w4a16_gemm` picks one per call.
"""

import torch
import triton
import triton.language as tl

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Nibble index that holds column c of a pack: the inverse permutation of AWQ_PACK_ORDER.
AWQ_UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
PACK_FACTOR = 8
# Above this many tokens the GEMM is compute bound and cuBLAS on a dequantised weight wins;
# benchmarks/bench_w4a16.py measures where the crossover really is on a given GPU.
TRITON_MAX_TOKENS = 256
W4A16_BACKENDS = ("auto", "triton", "torch")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] in AWQ order -> int32 [R, C] of values 0..15 in natural column order."""
    shifts = torch.tensor(
        [4 * i for i in AWQ_UNPACK_ORDER], dtype=torch.int32, device=packed.device
    )
    # Arithmetic shift of a negative int32 is fine: the mask keeps only the nibble.
    values = (packed.unsqueeze(-1) >> shifts) & 0xF
    return values.reshape(packed.shape[0], packed.shape[1] * PACK_FACTOR)


def dequantize_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The dense weight [K, N] (dtype of `scales`) that the packed tensors stand for."""
    q = unpack_int4(qweight)
    z = unpack_int4(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.repeat_interleave(group_size, dim=0)
    return (q - z).to(scales.dtype) * s


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


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_xk,
    stride_qwk, stride_qwn,
    stride_qzg, stride_qzn,
    stride_sg, stride_sn,
    stride_os, stride_om, stride_on,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # Column n lives in int32 n // 8 at nibble AWQ_UNPACK_ORDER[n % 8] = (c >> 1) + 4 * (c & 1).
    col = offs_n % 8
    shifts = ((col >> 1) + ((col & 1) << 2)) * 4
    pack_n = offs_n // 8

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # K is a multiple of BLOCK_K (it divides GROUP_SIZE), so no tile needs a K mask.
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None],
            other=0.0,
        )
        packed = tl.load(
            qw_ptr + offs_k[:, None] * stride_qwk + pack_n[None, :] * stride_qwn,
            mask=mask_n[None, :],
            other=0,
        )
        # BLOCK_K divides GROUP_SIZE, so the whole tile shares one group of zeros/scales.
        group = k0 // GROUP_SIZE
        packed_z = tl.load(qz_ptr + group * stride_qzg + pack_n * stride_qzn, mask=mask_n, other=0)
        scale = tl.load(s_ptr + group * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0)
        q = (packed >> shifts[None, :]) & 0xF
        z = (packed_z >> shifts) & 0xF
        w = (q - z[None, :]).to(tl.float32) * scale.to(tl.float32)[None, :]
        # Tensor cores take fp16/bf16 operands; fp32 inputs (CPU interpreter) stay fp32.
        acc = tl.dot(x, w.to(x.dtype), acc)

    out_ptrs = (
        out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    )
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _default_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> dict:
    """Tile sizes and split-K for an [m, k] x [k, n] product (no autotuning: works in the
    interpreter too; the benchmark sweeps alternatives)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 128 if n >= 128 else 64 if n >= 64 else 32
    block_k = min(group_size, 128 if m <= 16 else 64)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        split_k = max(1, min(2 * sms // tiles, k // (4 * block_k), 16))
    else:
        split_k = 1
    return {"block_m": block_m, "block_n": block_n, "block_k": block_k, "split_k": split_k}


def w4a16_gemm_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """x [M, K] (fp16/bf16 on GPU; fp32 or fp16 under TRITON_INTERPRET=1) -> [M, N] in x's dtype."""
    m, k = x.shape
    n = scales.shape[1]
    packed_n = n // PACK_FACTOR
    if qweight.shape != (k, packed_n) or qzeros.shape != (k // group_size, packed_n):
        raise ValueError(
            f"AWQ tensors do not match x [{m}, {k}]: qweight {tuple(qweight.shape)}, "
            f"qzeros {tuple(qzeros.shape)}, scales {tuple(scales.shape)}, group_size {group_size}"
        )
    cfg = _default_config(m, n, k, group_size, x.device)
    block_m = block_m or cfg["block_m"]
    block_n = block_n or cfg["block_n"]
    block_k = block_k or cfg["block_k"]
    split_k = split_k or cfg["split_k"]
    if k % group_size != 0 or group_size % block_k != 0:
        raise ValueError(
            f"block_k {block_k} must divide group_size {group_size}, which must divide K {k}"
        )
    # Each split covers a whole number of BLOCK_K tiles so that a tile never straddles two.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)
    if split_k == 1:
        out = torch.empty((1, m, n), dtype=x.dtype, device=x.device)
    else:
        out = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split_k)
    _w4a16_gemm_kernel[grid](
        x, qweight, qzeros, scales, out,
        m, n, k, k_per_split,
        x.stride(0), x.stride(1),
        qweight.stride(0), qweight.stride(1),
        qzeros.stride(0), qzeros.stride(1),
        scales.stride(0), scales.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        GROUP_SIZE=group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    result = out[0] if split_k == 1 else out.sum(dim=0).to(x.dtype)
    return result if bias is None else result + bias


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """`auto`: the Triton kernel on CUDA up to TRITON_MAX_TOKENS rows, else dequantise-then-matmul.
    `triton` forces the kernel (on CPU it needs TRITON_INTERPRET=1), `torch` the reference."""
    if backend == "torch" or (
        backend == "auto" and (x.device.type != "cuda" or x.shape[0] > TRITON_MAX_TOKENS)
    ):
        return w4a16_gemm_torch(x, qweight, qzeros, scales, group_size, bias)
    if backend not in W4A16_BACKENDS:
        raise ValueError(f"w4a16 backend must be one of {W4A16_BACKENDS}, got {backend!r}")
    return w4a16_gemm_triton(x, qweight, qzeros, scales, group_size, bias)
