"""Triton's view of the repacked W4A16 layout (kernels/reference/w4a16_repack.py): where a
column tile's packed words sit, which bits hold each row, a group's zeros and scales, and where
a paired gate | up layer's columns go back to (`layer_columns`). One
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
def layer_columns(offs_n, N, PAIRED: tl.constexpr):
    """Where stored columns `offs_n` sit in the layer's own order: themselves, or for a paired
    gate | up layer (`w4a16_repack.pair_halves`; N both halves) 2j -> gate j, 2j + 1 -> up j."""
    if PAIRED:
        return offs_n // 2 + (offs_n % 2) * (N // 2)
    return offs_n


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


# One L2 prefetch a 128-byte line: 32 packed words; a step covers this many lines (8 KB: one
# column tile's rows of a 256-row split, the decode splits' common size).
_PREFETCH_LINES = tl.constexpr(64)
_WORDS_PER_LINE = tl.constexpr(32)
PREFETCH_L2_ASM = "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;"
_PREFETCH_L2_ASM = tl.constexpr(PREFETCH_L2_ASM)


@triton.jit
def prefetch_words(qw_ptr, pid_n, pid_k, k_per_split, K, N, stride_qwt, BLOCK_N: tl.constexpr,
                   TILE: tl.constexpr, RECORD: tl.constexpr = False):
    """Ask L2 for a program's packed words, its split's rows of its BLOCK_N columns: in
    each of its column tiles those rows are one contiguous run of TILE-int32 rows. Weights are
    never written, so a kernel may do this before its PDL wait (kernels/triton/pdl.py): its
    weights stream in while the previous kernel still runs. Tiles past N (padding of the last
    program) are skipped: a prefetch must name memory that exists. RECORD (the tests, under the
    interpreter, which has no asm): count each address in `qw_ptr`'s tensor instead."""
    if BLOCK_N >= TILE:
        k_start = pid_k * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        lines = tl.arange(0, _PREFETCH_LINES) * _WORDS_PER_LINE
        count = ((k_end - k_start) // 8) * TILE  # words of one tile's rows
        for t in tl.static_range(BLOCK_N // TILE):
            tile = pid_n * (BLOCK_N // TILE) + t
            if tile * TILE < N:
                start = qw_ptr + tile.to(tl.int64) * stride_qwt + (k_start // 8) * TILE
                for offset in range(0, count, _PREFETCH_LINES * _WORDS_PER_LINE):
                    words = tl.minimum(offset + lines, count - 1)  # the tail repeats the last line
                    if RECORD:
                        tl.atomic_add(start + words, 1)
                    else:
                        tl.inline_asm_elementwise(_PREFETCH_L2_ASM, "=r,l", [start + words], dtype=tl.int32,
                                                  is_pure=False, pack=1)
