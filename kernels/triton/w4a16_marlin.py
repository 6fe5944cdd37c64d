"""Triton W4A16 on the repacked CUDA layout (kernels/reference/w4a16_repack.py), a
Marlin-class candidate beside the AutoAWQ-layout GEMM of `w4a16_gemm`.

Each program streams one column tile's packed weights as [BLOCK_K/8, BLOCK_N] int32 (rows of
TILE_N consecutive int32s: 128-bit loads, no copy of an int32 to the eight columns it feeds),
unpacks them with one shift and one mask (row j at ROW_SHIFTS[j]) into [BLOCK_K/8, 8, BLOCK_N], a reshape of
[BLOCK_K, BLOCK_N], and dequantises by the magic-number trick: (q | 0x6400) read as fp16 is
1024 + q exactly (bf16: 0x4300, 128 + q; fp32 under the interpreter: 2^23 + q), so
(magic(q) - magic(z)) * s is (q - z) * s with no int->float convert, bit for bit the
reference's weight (the subtraction is exact, the product rounds once). Compiled for CUDA
(fp16/bf16), q - z comes from inline PTX instead, Marlin's lop3 and one sub/fma per pair of
weights (kernels/triton/w4a16_lop3.py; the LOP3 constexpr, `MarlinConfig.plain_dequant` turns it
off to measure); the interpreter runs no asm and keeps the plain path. A symmetric (GPTQ)
layer has no zeros tensor: its zero point 8 is a constant. `BROADCAST_LOAD` is the other
unpacking to measure: each of the BLOCK_K rows loads its int32 (8 rows share an address)
and shifts by 4 * (k % 8), one [BLOCK_K, BLOCK_N] load and no reshape.

Split-K as in `w4a16_gemm` (the last program of an output tile sums the partials in split
order), with the split count chosen so the programs fill whole waves of the GPU, and the
tiles per M bucket from the GPU architecture's swept table (kernels/triton/
w4a16_marlin_plan.py). Above that table's fused_max_tokens: dequantise on the device, then
cuBLAS. Nothing makes a host tensor or synchronises, so CUDA graphs capture it.

Kept importable only through `kernels.dispatch` or directly by tests: `triton.jit` decides
compiled vs interpreted at import time.
"""

import os

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import TILE_N, RepackedW4
from kvdeck.kernels.triton.activation import NO_ACTIVATION, activation_code, gated_activation_triton
from kvdeck.kernels.triton.launch import device_arch, jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.w4a16_gemm import (
    SplitLaunch,
    _finish_tile,
    _split_counters,  # noqa: F401  (the tests read the counters)
    streaming_multiprocessors,
)
from kvdeck.kernels.triton.w4a16_gemv import w4a16_matmul_gemv
from kvdeck.kernels.triton.w4a16_layout import (
    layer_columns,
    load_group,
    load_words,
    packed_columns,
    prefetch_words,
    row_shift,
)
from kvdeck.kernels.triton.w4a16_lop3 import dequant_lop3
from kvdeck.kernels.triton.w4a16_marlin_plan import (  # noqa: F401  (names the tests and benches use)
    BROADCAST_CONFIG,
    FUSED_MAX_TOKENS,
    GEMV_CONFIG,
    M_BUCKETS,
    PROGRAMS_PER_SM,
    SWAP_CONFIG,
    MarlinConfig,
    choose_config,
    choose_split,
    tuning,
    use_tuning,
    wave_efficiency,
)

DEQUANT_BLOCK_K = 64
DEQUANT_BLOCK_N = 64
# The interpreter runs no inline asm: fixed when this module is imported, as `triton.jit` is.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _magic(q, DTYPE: tl.constexpr):
    """q (int32, 0..15) -> exactly BASE + q in DTYPE, by bits: fp16 1024, bf16 128, fp32 2^23."""
    if DTYPE == tl.float16:
        return (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    elif DTYPE == tl.bfloat16:
        return (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return (q | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_tile(qw_ptr, z_ptr, s_ptr, k0, offs_n, mask_n, stride_qwt, stride_zg, stride_sg,
                  GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, TILE: tl.constexpr, HAS_ZEROS: tl.constexpr,
                  BROADCAST_LOAD: tl.constexpr, LOP3: tl.constexpr):
    """The dense [BLOCK_K, BLOCK_N] weight of rows k0.. (one group: BLOCK_K divides it), in the
    scales' dtype as the reference makes it. LOP3: q - z by inline PTX (w4a16_lop3.py; CUDA,
    fp16/bf16, packed loads only), else by the magic numbers in plain Triton."""
    DTYPE: tl.constexpr = s_ptr.dtype.element_ty
    tl.static_assert(not (LOP3 and BROADCAST_LOAD), "the lop3 path takes packed words")
    columns = packed_columns(offs_n, stride_qwt, TILE)
    if BROADCAST_LOAD:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        packed = load_words(qw_ptr, offs_k // 8, columns, mask_n, TILE)
        q = (packed >> row_shift(offs_k % 8)[:, None]) & 0xF
    else:
        packed = load_words(qw_ptr, k0 // 8 + tl.arange(0, BLOCK_K // 8), columns, mask_n, TILE)
        if not LOP3:
            shifts = row_shift(tl.arange(0, 8))
            q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
    z, scale = load_group(z_ptr, s_ptr, k0 // GROUP_SIZE, offs_n, mask_n, stride_zg, stride_sg, HAS_ZEROS,
                          BLOCK_N)
    if LOP3:
        diff = dequant_lop3(packed, z, DTYPE)
    else:
        diff = _magic(q, DTYPE) - _magic(z, DTYPE)[None, :]
    return diff * scale[None, :]


@jit(do_not_specialize=('M', 'split_k'))  # batch-dependent: one variant for every value
def _w4a16_marlin_kernel(
    x_ptr, qw_ptr, z_ptr, s_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_xk, stride_qwt, stride_zg, stride_sg, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, TILE: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, BROADCAST_LOAD: tl.constexpr, LOP3: tl.constexpr, SWAP_AB: tl.constexpr,
    PAIRED: tl.constexpr = False, ACT: tl.constexpr = -1, PDL: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if PDL:  # the weights stream into L2 while the previous kernel runs (the first M tile's programs)
        if pid_m == 0:
            prefetch_words(qw_ptr, pid_n, pid_k, k_per_split, K, N, stride_qwt, BLOCK_N, TILE)
    pdl_start(PDL)  # before any other load or store (kernels/triton/pdl.py)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N

    if SWAP_AB:  # out^T = W^T x^T: the weights fill the MMA's wide M side (Hopper: wgmma)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(scalar(k_start), scalar(k_end), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if SWAP_AB:
            x = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None] * stride_xk,
                        mask=mask_m[None, :], other=0.0)  # x^T [BLOCK_K, BLOCK_M]
        else:
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=mask_m[:, None], other=0.0)
        w = _dequant_tile(qw_ptr, z_ptr, s_ptr, k0, offs_n, mask_n, stride_qwt, stride_zg,
                          stride_sg, GROUP_SIZE, BLOCK_K, BLOCK_N, TILE, HAS_ZEROS,
                          BROADCAST_LOAD, LOP3).to(x.dtype)
        if SWAP_AB:
            acc = tl.dot(tl.trans(w), x, acc)
        else:
            acc = tl.dot(x, w, acc)
    if SWAP_AB:
        acc = tl.trans(acc)

    _finish_tile(acc, out_ptr, bias_ptr, partial_ptr, counter_ptr, M, N, offs_m, offs_n, mask_m, mask_n,
                 stride_om, pid_m, pid_n, pid_k, split_k, BLOCK_M, BLOCK_N, HAS_BIAS, SPLIT_K, PAIRED, ACT)


@triton.jit
def _marlin_dequantize_kernel(
    qw_ptr, z_ptr, s_ptr, out_ptr, N, stride_qwt, stride_zg, stride_sg, stride_ok,
    GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, TILE: tl.constexpr,
    HAS_ZEROS: tl.constexpr, LOP3: tl.constexpr, PAIRED: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    k0 = tl.program_id(0) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w = _dequant_tile(qw_ptr, z_ptr, s_ptr, k0, offs_n, mask_n, stride_qwt, stride_zg, stride_sg,
                      GROUP_SIZE, BLOCK_K, BLOCK_N, TILE, HAS_ZEROS, False, LOP3)
    columns = layer_columns(offs_n, N, PAIRED)  # a paired layer's weight back in its own order
    tl.store(out_ptr + offs_k[:, None] * stride_ok + columns[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask_n[None, :])


def config_for(m: int, n: int, k: int, group_size: int, device: torch.device) -> MarlinConfig:
    """What a launch on `device` runs: its architecture's tuned buckets, split to its SM count."""
    return choose_config(m, n, k, group_size, streaming_multiprocessors(device), device_arch(device))


def uses_lop3(device: torch.device, dtype: torch.dtype, plain: bool = False) -> bool:
    """Whether a launch dequantises with the inline PTX: compiled for CUDA, fp16/bf16 scales."""
    return (not plain and not INTERPRETED and device.type == "cuda"
            and dtype in (torch.float16, torch.bfloat16))


def _check(x: torch.Tensor, w: RepackedW4, bias: torch.Tensor | None = None,
           activation: str | None = None) -> int:
    """The launch's ACT code (activation.py's; -1 with no `activation`), once the shapes fit."""
    if x.shape[1] != w.k:
        raise ValueError(f"x [{x.shape[0]}, {x.shape[1]}] does not fit a [{w.k}, {w.n}] weight")
    if w.group_size % 16 or w.group_size & (w.group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 16, got {w.group_size}")
    if w.paired and bias is not None:  # pairing is for gate | up layers, which have none
        raise ValueError("a layer with paired gate and up columns takes no bias")
    if activation is None:
        return NO_ACTIVATION
    if not w.paired:
        raise ValueError("a fused gated activation needs the gate and up columns paired (pair_halves)")
    return activation_code(activation)


def w4a16_matmul_marlin(x: torch.Tensor, w: RepackedW4, bias: torch.Tensor | None = None,
                        config: MarlinConfig | None = None, activation: str | None = None) -> torch.Tensor:
    """The fused GEMM for any M. x [M, K]: fp16/bf16 on a GPU, fp32 or fp16 under
    TRITON_INTERPRET=1. Returns [M, N] in x's dtype (a paired weight's columns in the layer's
    order), or with `activation` ("silu", "gelu_tanh"; a paired weight) act(gate) * up, [M, N/2],
    applied by the kernel's epilogue."""
    act = _check(x, w, bias, activation)
    m, k = x.shape
    if config is None:
        config = config_for(m, w.n, k, w.group_size, x.device)
    if w.group_size % config.block_k or config.block_k % 16:
        raise ValueError(f"block_k {config.block_k} must be a multiple of 16 dividing the group")
    if config.gemv:
        lop3 = uses_lop3(x.device, w.scales.dtype, config.plain_dequant)
        return w4a16_matmul_gemv(x, w, bias, config, lop3, act)
    out = torch.empty((m, w.n if act < 0 else w.n // 2), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = SplitLaunch.make(out, k, config.block_m, config.block_n, config.block_k, config.split_k, w.n)
    zeros = w.zeros if w.zeros is not None else w.scales  # unused placeholder when symmetric
    launch(_w4a16_marlin_kernel, split.grid,
           x, w.qweight, zeros, w.scales, out if bias is None else bias, out, split.partial, split.counters,
           m, w.n, k, split.k_per_split, split.split_k,
           x.stride(0), x.stride(1), w.qweight.stride(0), zeros.stride(0), w.scales.stride(0),
           out.stride(0),
           GROUP_SIZE=w.group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
           BLOCK_K=config.block_k, TILE=TILE_N, HAS_ZEROS=w.zeros is not None,
           HAS_BIAS=bias is not None, SPLIT_K=split.split_k > 1, BROADCAST_LOAD=config.broadcast_load,
           LOP3=not config.broadcast_load and uses_lop3(x.device, w.scales.dtype, config.plain_dequant),
           SWAP_AB=config.swap_ab, PAIRED=w.paired, ACT=act, num_warps=config.num_warps,
           num_stages=config.num_stages)
    return out


def dequantize_marlin(w: RepackedW4, dtype: torch.dtype | None = None,
                      plain: bool = False) -> torch.Tensor:
    """The dense weight [K, N] (`dtype`, default the scales'; a paired weight's columns in the
    layer's order), made on the device (`plain`: the plain-Triton dequantisation on CUDA too)."""
    dtype = dtype or w.scales.dtype
    out = torch.empty((w.k, w.n), dtype=dtype, device=w.qweight.device)
    block_k = min(DEQUANT_BLOCK_K, w.group_size)
    zeros = w.zeros if w.zeros is not None else w.scales
    grid = (w.k // block_k, triton.cdiv(w.n, DEQUANT_BLOCK_N))
    launch(_marlin_dequantize_kernel, grid,
           w.qweight, zeros, w.scales, out, w.n, w.qweight.stride(0), zeros.stride(0),
           w.scales.stride(0), out.stride(0),
           GROUP_SIZE=w.group_size, BLOCK_K=block_k, BLOCK_N=DEQUANT_BLOCK_N, TILE=TILE_N,
           HAS_ZEROS=w.zeros is not None, LOP3=uses_lop3(w.qweight.device, w.scales.dtype, plain),
           PAIRED=w.paired)
    return out


def w4a16_gemm_marlin(x: torch.Tensor, w: RepackedW4, bias: torch.Tensor | None = None,
                      activation: str | None = None) -> torch.Tensor:
    """What the engine runs with this kernel: the fused GEMM up to the architecture's
    fused_max_tokens rows (FUSED_MAX_TOKENS untuned), above that a device-side dequantise and
    one cuBLAS matmul (the bias fused into addmm). `activation` (a paired gate | up weight):
    act(gate) * up, by the fused GEMM's epilogue, or after cuBLAS by the activation kernel."""
    if x.shape[0] <= tuning(device_arch(x.device)).fused_max_tokens:
        return w4a16_matmul_marlin(x, w, bias, activation=activation)
    _check(x, w, bias, activation)
    weight = dequantize_marlin(w, x.dtype)
    out = x @ weight if bias is None else torch.addmm(bias.to(x.dtype), x, weight)
    return out if activation is None else gated_activation_triton(out, activation)
