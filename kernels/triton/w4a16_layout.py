"""Triton's view of the repacked W4A16 layout (kernels/reference/w4a16_repack.py): where a
column tile's packed words sit, which bits hold each row, and a group's zeros and scales. One
home for the loads the fused kernel (w4a16_marlin.py), the GEMV form (w4a16_gemv.py) and the
benchmarks' part-kernels (benchmarks/w4a16_anatomy.py) all make, so they read the same words.
"""

import triton
import triton.language as tl


@triton.jit
def row_shift(j):
    """Bit offset of row j (0..7) of a packed int32: the layout's ROW_SHIFTS (interleaved rows)."""
    return 4 * ((j >> 1) + 4 * (j & 1))


@triton.jit
def packed_columns(offs_n, stride_qwt, TILE: tl.constexpr):
    """Each output column's offset in qweight [N_pad/TILE, K/8, TILE]: its tile, then its lane."""
    return (offs_n // TILE) * stride_qwt + offs_n % TILE


@triton.jit
def load_words(qw_ptr, word_rows, columns, mask_n, TILE: tl.constexpr):
    """The packed words of rows `word_rows` (K/8 indices) and `columns` (packed_columns):
    [rows, columns] int32, each row TILE consecutive int32s (128-bit loads)."""
    return tl.load(qw_ptr + word_rows[:, None] * TILE + columns[None, :], mask=mask_n[None, :], other=0)


@triton.jit
def load_group(z_ptr, s_ptr, group, offs_n, mask_n, stride_zg, stride_sg, HAS_ZEROS: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """(zero points int32, scales in their own dtype) of one group's columns; without zeros
    (GPTQ's symmetric form) every zero point is 8."""
    if HAS_ZEROS:
        z = tl.load(z_ptr + group * stride_zg + offs_n, mask=mask_n, other=0).to(tl.int32)
    else:
        z = tl.full((BLOCK_N,), 8, tl.int32)  # SYMMETRIC_ZERO (a jit function reads no globals)
    return z, tl.load(s_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0)
