"""Triton W4A16 for a handful of tokens on the repacked CUDA layout: a GEMV, no tensor cores.

The fused kernel of `w4a16_marlin` multiplies a [16, BLOCK_K] activation tile (padded from
the 1-4 rows decode has) on mma.sync, and on sm_90 its K loop spends 294 instructions a thread
on 64 weights (4.59 a weight), 49 of them register moves that assemble the padded activation
operand. Here each packed int32 (eight rows of one column, w4a16_repack's layout) meets its
eight activations directly: one inline-PTX block (`w4a16_lop3.dot_word_lop3`) dequantises the
word by lop3 and multiplies-adds the four 16-bit pairs against the four activation pairs
(loaded as int32: two consecutive activations each), the halves summed in fp32, and the
word's sum times its column's scale is added to an fp32 accumulator. About 2 instructions a
weight a row: for BLOCK_M rows each row repeats the multiply-adds, so it pays where M is 1-4.

The loads are those of `w4a16_marlin` (a column tile's packed words as [BLOCK_K/8, BLOCK_N],
128-bit rows; the group's zeros and scales), pipelined through cp.async `STAGES` deep: the
loop asks for it (`tl.range(num_stages=...)`), since Triton pipelines loads that feed no dot
only when asked. Split-K and its deterministic epilogue are `w4a16_gemm._finish_tile`'s.
Numerics: the products and the sums of each word's four pairs round in the activations'
16-bit type (as the fused kernel's dequantised weights do), everything after is fp32; under
the interpreter (no asm) the same sums are taken in fp32 from the magic-number q - z.

Launched by `w4a16_marlin.w4a16_matmul_marlin` for a `MarlinConfig` with `gemv` set (the
architecture's tuned `gemv_max_tokens`, off until a GPU sweep picks it).
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import TILE_N, RepackedW4
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.w4a16_gemm import SplitLaunch, _finish_tile
from kvdeck.kernels.triton.w4a16_layout import (
    load_group,
    load_words,
    packed_columns,
    prefetch_words,
    row_shift,
)
from kvdeck.kernels.triton.w4a16_lop3 import dot_word_lop3, zero_pairs


@triton.jit
def _word_sums_plain(packed, z, x_row, offs_p):
    """[P, BLOCK_N] fp32: sum_j (q_j - z) * x[8p + j] in plain Triton (the interpreter)."""
    rows = tl.arange(0, 8)
    x = tl.load(x_row + offs_p[:, None] * 8 + rows[None, :]).to(tl.float32)  # [P, 8]
    q = (packed[:, None, :] >> row_shift(rows)[None, :, None]) & 0xF  # [P, 8, BLOCK_N]
    diff = (q - z[None, None, :]).to(tl.float32)
    return tl.sum(diff * x[:, :, None], axis=1)


@triton.jit
def _word_sums_lop3(packed, z, x_row, offs_p, DTYPE: tl.constexpr):
    """The same sums by the inline PTX: the activations as int32 pairs, four a word."""
    x_pairs = x_row.to(tl.pointer_type(tl.int32)) + offs_p * 4
    lo, hi = zero_pairs(z, DTYPE)
    x0, x1 = tl.load(x_pairs)[:, None], tl.load(x_pairs + 1)[:, None]
    x2, x3 = tl.load(x_pairs + 2)[:, None], tl.load(x_pairs + 3)[:, None]
    return dot_word_lop3(packed, lo[None, :], hi[None, :], x0, x1, x2, x3, DTYPE)


@jit(do_not_specialize=("M", "split_k"))  # batch-dependent: one variant for every value
def _w4a16_gemv_kernel(
    x_ptr, qw_ptr, z_ptr, s_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_qwt, stride_zg, stride_sg, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILE: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, LOP3: tl.constexpr,
    STAGES: tl.constexpr, PAIRED: tl.constexpr = False, ACT: tl.constexpr = -1, PDL: tl.constexpr = False,
):
    pid_m = tl.program_id(0)  # one activation row a program
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if PDL:  # the weights stream into L2 while the previous kernel runs (the first row's programs)
        if pid_m == 0:
            prefetch_words(qw_ptr, pid_n, pid_k, k_per_split, K, N, stride_qwt, BLOCK_N, TILE)
    pdl_start(PDL)  # before any other load or store (kernels/triton/pdl.py)
    offs_m = pid_m + tl.arange(0, 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    columns = packed_columns(offs_n, stride_qwt, TILE)
    DTYPE: tl.constexpr = s_ptr.dtype.element_ty

    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in tl.range(scalar(k_start), scalar(k_end), BLOCK_K, num_stages=STAGES):
        offs_p = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = load_words(qw_ptr, offs_p, columns, mask_n, TILE)
        z, scale = load_group(z_ptr, s_ptr, k0 // GROUP_SIZE, offs_n, mask_n, stride_zg, stride_sg, HAS_ZEROS,
                              BLOCK_N)
        if LOP3:
            sums = _word_sums_lop3(packed, z, x_row, offs_p, DTYPE)
        else:
            sums = _word_sums_plain(packed, z, x_row, offs_p)
        acc += sums * scale.to(tl.float32)[None, :]  # one group a K step: BLOCK_K divides it

    _finish_tile(tl.sum(acc, axis=0)[None, :], out_ptr, bias_ptr, partial_ptr, counter_ptr, M, N,
                 offs_m, offs_n, mask_m, mask_n, stride_om, pid_m, pid_n, pid_k, split_k, 1, BLOCK_N,
                 HAS_BIAS, SPLIT_K, PAIRED, ACT)


def w4a16_matmul_gemv(x: torch.Tensor, w: RepackedW4, bias: torch.Tensor | None, config,
                      lop3: bool, act: int = -1) -> torch.Tensor:
    """x [M, K] (M small: one program a row and column tile) times the repacked weight, [M, N]
    in x's dtype; `config` a GEMV-form MarlinConfig fitted to the shape (its split_k), `lop3`
    whether the inline PTX runs (w4a16_marlin.uses_lop3), `act` a fused gated activation's
    code for a paired weight ([M, N/2] out; w4a16_marlin.w4a16_matmul_marlin checks it)."""
    if not config.gemv or config.block_m != 1:
        raise ValueError(f"not a GEMV-form config: {config}")
    if lop3 and x.dtype != w.scales.dtype:  # the PTX multiplies the activations as the scales' type
        raise ValueError(f"the GEMV form's PTX needs activations in the scales' dtype: x is {x.dtype}, "
                         f"scales are {w.scales.dtype}")
    m, k = x.shape
    # The activation pairs load as int32: unit stride along K, rows and base 4-byte aligned.
    if x.stride(1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:
        x = x.clone(memory_format=torch.contiguous_format)
    out = torch.empty((m, w.n if act < 0 else w.n // 2), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = SplitLaunch.make(out, k, 1, config.block_n, config.block_k, config.split_k, w.n)
    zeros = w.zeros if w.zeros is not None else w.scales  # unused placeholder when symmetric
    launch(_w4a16_gemv_kernel, split.grid,
           x, w.qweight, zeros, w.scales, out if bias is None else bias, out, split.partial, split.counters,
           m, w.n, k, split.k_per_split, split.split_k,
           x.stride(0), w.qweight.stride(0), zeros.stride(0), w.scales.stride(0), out.stride(0),
           GROUP_SIZE=w.group_size, BLOCK_N=config.block_n, BLOCK_K=config.block_k, TILE=TILE_N,
           HAS_ZEROS=w.zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=split.split_k > 1, LOP3=lop3,
           STAGES=config.num_stages, PAIRED=w.paired, ACT=act, num_warps=config.num_warps)
    return out
