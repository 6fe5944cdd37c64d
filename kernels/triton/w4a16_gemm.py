"""Triton W4A16 for AutoAWQ's GEMM layout (see `kernels.w4a16_gemm` for the layout).

Up to FUSED_MAX_TOKENS rows, one fused GEMM: each program loads its packed weights as a
[BLOCK_K, BLOCK_N/8] int32 tile (every int32 crosses memory and is staged in shared
memory once), widens it to [BLOCK_K, BLOCK_N] in registers and unpacks the nibbles there
(AutoAWQ's order, as vLLM's awq_triton does), then dequantises to the activations' dtype
(bit for bit the reference's dense weight) for the tensor cores, accumulating in fp32.
Small M splits K across programs so a handful of tokens still fills the GPU; the
last program of each output tile to finish sums the partial tiles in split order
(deterministic) and writes the output and bias, so a split needs no second kernel.

Above FUSED_MAX_TOKENS the GEMM is compute bound: the weight is dequantised on the device
by a Triton kernel and cuBLAS multiplies. Nothing on either path makes a host tensor or
synchronises, so CUDA graphs capture AWQ layers at every decode bucket.

Kept importable only through `kernels.dispatch.w4a16_gemm` or directly by tests:
`triton.jit` decides compiled vs interpreted at import time.
"""

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from kvdeck.kernels.ops import PACK_FACTOR
from kvdeck.kernels.triton.activation import gated_product
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.w4a16_layout import layer_columns


@dataclass(frozen=True, slots=True)
class W4A16Config:
    block_m: int
    block_n: int
    block_k: int  # at most: choose_config narrows it to divide the group
    split_k: int
    num_warps: int
    num_stages: int


# (largest M of the bucket, its config), smallest bucket first. Chosen without a GPU: shared memory
# within the 99 KiB of sm_86/sm_89 and no register spills on sm_80..sm_90 for fp16/bf16 at
# groups 32..128 (benchmarks/compile_for_gpu.py, table in kernels/README.md). split_k here
# is the most a call may use; `choose_config` fits it to the shape and the SM count.
# GPU timings are still to be taken: benchmarks/bench_w4a16.py sweeps alternatives.
M_BUCKETS: tuple[tuple[int, W4A16Config], ...] = (
    (16, W4A16Config(block_m=16, block_n=128, block_k=64, split_k=16, num_warps=8, num_stages=4)),
    (32, W4A16Config(block_m=32, block_n=128, block_k=64, split_k=8, num_warps=8, num_stages=3)),
    (64, W4A16Config(block_m=64, block_n=128, block_k=64, split_k=4, num_warps=8, num_stages=3)),
    (256, W4A16Config(block_m=128, block_n=128, block_k=32, split_k=2, num_warps=8, num_stages=4)),
)
FUSED_MAX_TOKENS = M_BUCKETS[-1][0]
# A split must still stream a few K tiles, or the partial tiles cost more than they hide.
MIN_K_TILES_PER_SPLIT = 2
DEQUANT_BLOCK_K = 32
DEQUANT_BLOCK_N = 128


@triton.jit
def _widen_packs(packed):
    """[..., P] int32 -> [..., 8 * P], each int32 repeated for the 8 columns it holds (in
    registers: every interleave joins a new innermost dim that one thread owns)."""
    packed = tl.interleave(packed, packed)
    packed = tl.interleave(packed, packed)
    return tl.interleave(packed, packed)


@triton.jit
def _nibble_shifts(BLOCK_N: tl.constexpr):
    """Bit offset of each of BLOCK_N columns inside its int32: 4 * AWQ_UNPACK_ORDER[n % 8]."""
    column = tl.arange(0, BLOCK_N) % 8
    return ((column >> 1) + ((column & 1) << 2)) * 4


@triton.jit
def _store_output(out_ptr, acc, bias_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, N,
                  HAS_BIAS: tl.constexpr, PAIRED: tl.constexpr):
    """The finished fp32 tile, rounded to the output's dtype, stored; where the weight's
    columns are paired (gate j, up j: kernels/reference/w4a16_repack.py's `pair_halves`, N
    counting both halves), back in the layer's order."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    columns = layer_columns(offs_n, N, PAIRED)
    tl.store(out_ptr + offs_m[:, None] * stride_om + columns[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _store_gated(out_ptr, gate, up, offs_m, pairs, mask_m, stride_om, N, ACT: tl.constexpr):
    """act(gate) * up of a paired tile's fp32 halves [BLOCK_M, pairs] into out [M, N/2]: each
    half rounded to the output's dtype first, as a GEMM stores the product the activation
    kernel then reads, and that kernel's arithmetic (activation.py's `gated_product`)."""
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + offs_m[:, None] * stride_om + pairs[None, :],
             gated_product(gate.to(dtype), up.to(dtype), ACT).to(dtype),
             mask=mask_m[:, None] & (pairs < N // 2)[None, :])


@triton.jit
def _finish_tile(acc, out_ptr, bias_ptr, partial_ptr, counter_ptr, M, N, offs_m, offs_n, mask_m, mask_n,
                 stride_om, pid_m, pid_n, pid_k, split_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, PAIRED: tl.constexpr, ACT: tl.constexpr):
    """A program's fp32 tile (columns pid_n * BLOCK_N ...) into the output: at once, or with
    split-K as its partial, the last of a tile's programs to arrive summing the partials in
    split order and storing. PAIRED: the weight's gate and up columns are paired; ACT >= 0
    (activation.py's codes): store act(gate) * up, [M, N/2], in place of the product."""
    tl.static_assert(ACT < 0 or (PAIRED and not HAS_BIAS), "a fused activation takes paired columns, no bias")
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K:
        part_offs = offs_m[:, None] * N + offs_n[None, :]
        tl.store(partial_ptr + pid_k * M * N + part_offs, acc, mask=mask)
        # Every thread's partial is written before the arrival is counted (release), and the
        # last program reads the others' partials only after its count (acquire).
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            if ACT >= 0:
                # Each half read apart (strided: no registers shuffle the pairs), its offsets
                # split from the partial tile's own: with triton 3.6 (the GPU image's), offsets
                # of their own made the K loop rematerialise addresses (sm_90 bf16 K loop: 349
                # SASS instructions a step that way, 309 this way; with 3.9, 290 and 297).
                gate_offs, up_offs = tl.split(tl.reshape(part_offs, (BLOCK_M, BLOCK_N // 2, 2)))
                pair_mask, _ = tl.split(tl.reshape(mask, (BLOCK_M, BLOCK_N // 2, 2)))
                gate = tl.zeros((BLOCK_M, BLOCK_N // 2), dtype=tl.float32)
                up = tl.zeros((BLOCK_M, BLOCK_N // 2), dtype=tl.float32)
                for split in range(0, scalar(split_k)):  # split order, whichever program finished last
                    gate += tl.load(partial_ptr + split * M * N + gate_offs, mask=pair_mask, other=0.0,
                                    cache_modifier=".cg")
                    up += tl.load(partial_ptr + split * M * N + up_offs, mask=pair_mask, other=0.0,
                                  cache_modifier=".cg")
                gate_columns, _ = tl.split(tl.reshape(offs_n, (BLOCK_N // 2, 2)))
                _store_gated(out_ptr, gate, up, offs_m, gate_columns // 2, mask_m, stride_om, N, ACT)
            else:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for split in range(0, scalar(split_k)):  # split order, whichever program finished last
                    acc += tl.load(partial_ptr + split * M * N + part_offs, mask=mask, other=0.0,
                                   cache_modifier=".cg")
                _store_output(out_ptr, acc, bias_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, N,
                              HAS_BIAS, PAIRED)
            tl.atomic_xchg(counter_ptr + tile, 0)  # ready for the next launch
    elif ACT >= 0:  # rounded before the pairs are pulled apart: half the registers to shuffle
        gate, up = tl.split(tl.reshape(acc.to(out_ptr.dtype.element_ty), (BLOCK_M, BLOCK_N // 2, 2)))
        gate_columns, _ = tl.split(tl.reshape(offs_n, (BLOCK_N // 2, 2)))  # the pairs in the halves' layout
        _store_gated(out_ptr, gate, up, offs_m, gate_columns // 2, mask_m, stride_om, N, ACT)
    else:
        _store_output(out_ptr, acc, bias_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, N, HAS_BIAS, PAIRED)


@jit(do_not_specialize=('M', 'split_k'))  # batch-dependent: one variant for every value
def _w4a16_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_xk, stride_qwk, stride_qzg, stride_sg, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_pack = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask_pack = offs_pack < N // 8
    shifts = _nibble_shifts(BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # BLOCK_K divides GROUP_SIZE, which divides K: no tile needs a K mask or spans two groups.
    for k0 in range(scalar(k_start), scalar(k_end), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None], other=0.0)
        packed = tl.load(qw_ptr + offs_k[:, None] * stride_qwk + offs_pack[None, :],
                         mask=mask_pack[None, :], other=0)
        group = k0 // GROUP_SIZE
        packed_z = tl.load(qz_ptr + group * stride_qzg + offs_pack, mask=mask_pack, other=0)
        scale = tl.load(s_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0)
        q = (_widen_packs(packed) >> shifts[None, :]) & 0xF
        z = (_widen_packs(packed_z) >> shifts) & 0xF
        # (q - z) * s is exact in fp32; its one rounding to x's dtype matches the reference.
        w = ((q - z[None, :]).to(tl.float32) * scale.to(tl.float32)[None, :]).to(x.dtype)
        acc = tl.dot(x, w, acc)

    _finish_tile(acc, out_ptr, bias_ptr, partial_ptr, counter_ptr, M, N, offs_m, offs_n, mask_m, mask_n,
                 stride_om, pid_m, pid_n, pid_k, split_k, BLOCK_M, BLOCK_N, HAS_BIAS, SPLIT_K, False, -1)


@triton.jit
def _awq_dequantize_kernel(
    qw_ptr, qz_ptr, s_ptr, out_ptr, K, N, stride_qwk, stride_qzg, stride_sg, stride_ok,
    GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_pack = tl.program_id(1) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    mask_k = offs_k < K
    mask_pack = mask_k[:, None] & (offs_pack < N // 8)[None, :]
    mask = mask_k[:, None] & (offs_n < N)[None, :]
    group = offs_k // GROUP_SIZE
    shifts = _nibble_shifts(BLOCK_N)
    packed = tl.load(qw_ptr + offs_k[:, None] * stride_qwk + offs_pack[None, :], mask=mask_pack, other=0)
    packed_z = tl.load(qz_ptr + group[:, None] * stride_qzg + offs_pack[None, :], mask=mask_pack,
                       other=0)
    scale = tl.load(s_ptr + group[:, None] * stride_sg + offs_n[None, :], mask=mask, other=0.0)
    q = (_widen_packs(packed) >> shifts[None, :]) & 0xF
    z = (_widen_packs(packed_z) >> shifts[None, :]) & 0xF
    # (q - z) * s is exact in fp32 before the one rounding to the output dtype, as in the
    # reference's (q - z).to(dtype) * s.
    w = (q - z).to(tl.float32) * scale.to(tl.float32)
    tl.store(out_ptr + offs_k[:, None] * stride_ok + offs_n[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask)


def streaming_multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter gains nothing from splitting
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_config(m: int, n: int, k: int, group_size: int, num_sms: int) -> W4A16Config:
    """The bucket's tiles for an [m, k] x [k, n] product, with block_k fitted to the group and
    split_k to the SM count (about two programs per SM, each split at least a few K tiles)."""
    bucket = next((cfg for limit, cfg in M_BUCKETS if m <= limit), M_BUCKETS[-1][1])
    block_k = math.gcd(bucket.block_k, group_size)  # a power of two that divides the group
    tiles = triton.cdiv(m, bucket.block_m) * triton.cdiv(n, bucket.block_n)
    k_tiles = k // block_k
    split_k = max(1, min(bucket.split_k, triton.cdiv(2 * num_sms, tiles),
                         k_tiles // MIN_K_TILES_PER_SPLIT))
    # Splits take whole BLOCK_K tiles; fewer splits may cover K just as evenly.
    split_k = triton.cdiv(k_tiles, triton.cdiv(k_tiles, split_k))
    return replace(bucket, block_k=block_k, split_k=split_k)


class _SplitCounters:
    """Per-device int32 arrival counters for the split-K reduction, one per output tile.

    The kernel sets every counter it used back to 0, so a buffer is zeroed once, when it is
    made, and reused by every launch after it (no memset per call). Captured graphs keep
    the address of the buffer they used, so a buffer that is outgrown is kept, not freed.
    Launches on one device must run in stream order (the step's stream: only the LoRA shrink
    may run beside it, kernels/triton/lora.py).
    """

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []

    def get(self, device: torch.device, tiles: int) -> torch.Tensor:
        counters = self._buffers.get(device)
        if counters is not None and counters.numel() >= tiles:
            return counters
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Made inside a capture, a cached buffer would be zeroed only when the graph
            # replays; this graph gets its own, zeroed by a captured memset.
            return torch.zeros(tiles, dtype=torch.int32, device=device)
        if counters is not None:
            self._outgrown.append(counters)
        counters = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        self._buffers[device] = counters
        return counters


_split_counters = _SplitCounters()


@dataclass(slots=True)
class SplitLaunch:
    """How a split-K GEMM launch of [m, k] x [k, n] is shaped: each split covers a whole number
    of BLOCK_K tiles (no tile straddles two), and with more than one split the fp32 partials
    and the arrival counters `_finish_tile` sums through (else `out`, an unused placeholder)."""
    k_per_split: int
    split_k: int
    grid: tuple[int, int, int]
    partial: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def make(cls, out: torch.Tensor, k: int, block_m: int, block_n: int, block_k: int,
             split_k: int, n: int | None = None) -> "SplitLaunch":
        """`n`: the product's columns where `out` has fewer (a fused gated activation's half)."""
        m, n = out.shape[0], out.shape[1] if n is None else n
        k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
        split_k = triton.cdiv(k, k_per_split)
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split_k)
        if split_k == 1:
            return cls(k_per_split, 1, grid, out, out)
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=out.device)
        return cls(k_per_split, split_k, grid, partial, _split_counters.get(out.device, grid[0] * grid[1]))


def _check_awq_tensors(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor,
                       scales: torch.Tensor, group_size: int) -> None:
    m, k = x.shape
    packed_n = scales.shape[1] // PACK_FACTOR
    if (qweight.shape != (k, packed_n) or qzeros.shape != (k // group_size, packed_n)
            or k % group_size != 0):
        raise ValueError(
            f"AWQ tensors do not match x [{m}, {k}]: qweight {tuple(qweight.shape)}, "
            f"qzeros {tuple(qzeros.shape)}, scales {tuple(scales.shape)}, group_size {group_size}"
        )
    if group_size % 16 != 0:
        raise ValueError(f"group_size must be a multiple of 16, got {group_size}")
    if min(qweight.stride(1), qzeros.stride(1), scales.stride(1)) != 1:
        raise ValueError("qweight, qzeros and scales need a unit stride along the output dim")


def w4a16_matmul_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """The fused GEMM for any M (the engine uses it up to FUSED_MAX_TOKENS rows). x [M, K]:
    fp16/bf16 on GPU; fp32 or fp16 under TRITON_INTERPRET=1. Returns [M, N] in x's dtype."""
    _check_awq_tensors(x, qweight, qzeros, scales, group_size)
    m, k = x.shape
    n = scales.shape[1]
    if config is None:
        config = choose_config(m, n, k, group_size, streaming_multiprocessors(x.device))
    if group_size % config.block_k != 0:
        raise ValueError(f"block_k {config.block_k} must divide group_size {group_size}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = SplitLaunch.make(out, k, config.block_m, config.block_n, config.block_k, config.split_k)
    launch(_w4a16_gemm_kernel, split.grid,
        x, qweight, qzeros, scales, out if bias is None else bias, out, split.partial, split.counters,
        m, n, k, split.k_per_split, split.split_k,
        x.stride(0), x.stride(1), qweight.stride(0), qzeros.stride(0), scales.stride(0),
        out.stride(0),
        GROUP_SIZE=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, HAS_BIAS=bias is not None, SPLIT_K=split.split_k > 1,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def awq_dequantize_triton(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The dense weight [K, N] (`dtype`, default that of `scales`), made on the device."""
    k, n = qweight.shape[0], scales.shape[1]
    out = torch.empty((k, n), dtype=dtype or scales.dtype, device=qweight.device)
    grid = (triton.cdiv(k, DEQUANT_BLOCK_K), triton.cdiv(n, DEQUANT_BLOCK_N))
    launch(_awq_dequantize_kernel, grid,
        qweight, qzeros, scales, out, k, n,
        qweight.stride(0), qzeros.stride(0), scales.stride(0), out.stride(0),
        GROUP_SIZE=group_size, BLOCK_K=DEQUANT_BLOCK_K, BLOCK_N=DEQUANT_BLOCK_N,
    )
    return out


def w4a16_gemm_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """What the engine runs on CUDA: the fused GEMM up to FUSED_MAX_TOKENS rows, above that a
    device-side dequantise and one cuBLAS matmul (with the bias fused into addmm)."""
    if x.shape[0] <= FUSED_MAX_TOKENS:
        return w4a16_matmul_triton(x, qweight, qzeros, scales, group_size, bias)
    _check_awq_tensors(x, qweight, qzeros, scales, group_size)
    weight = awq_dequantize_triton(qweight, qzeros, scales, group_size, dtype=x.dtype)
    return x @ weight if bias is None else torch.addmm(bias.to(x.dtype), x, weight)
