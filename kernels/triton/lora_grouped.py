"""Triton LoRA shrink/expand over tiles of rows that share an adapter (the segmented form of
vLLM's punica kernels, SGMV): the `grouped` launch config (kernels/triton/lora_plan.py).

The per-row pair (kernels/triton/lora.py) launches a program per adapter row, and each reads
its adapter's A and B whole: at decode, 64 rows of 8 adapters read each adapter's weights 8
times over, and the expand's 3,072 programs per fused q/k/v layer each do a few hundred
multiply-adds. Here a program takes one tile of up to BLOCK_M rows of one slot
(kernels/reference/lora_tiles.py: the step's tiles, built on the host, in one int32 buffer a
decode graph reads) and multiplies them together: the shrink's [rows, K] @ A^T and the
expand's h @ B^T as tile products (tensor cores for 16-bit inputs, fp32 sums), each slot's
weights read once a tile. Same contract as kernels/reference/lora.py (slot layout, fp32 sums);
each slot's rank is read from `slot_ranks`, so the kernels never load a slot's zero padding.
The launch forms are the per-row pair's: two launches (h partials per chunk of `split_k`
inputs, summed by the expand), one (`fused`: each expand program computes its tile's h), or
the shrink on a side stream beside the base GEMM (`overlap`).
Import through `kernels.dispatch.lora_linear`.
"""

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.lora_tiles import RowTiles
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.lora import _output_blocks, overlap_streams, shrink_partials, stream_context
from kvdeck.kernels.triton.lora_plan import GROUP_ROWS, LoRAKernelConfig
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.tile_dot import dot_flags, tile_dot

_TILE = 4096  # elements of an A or x tile a shrink program holds per K step (BLOCK_K x BLOCK_R)


def grouped_block_r(rank: int) -> int:
    """The rank block: a power of two, at least 16 (a tile product's smallest side)."""
    return max(16, triton.next_power_of_2(rank))


def grouped_block_k(block_r: int, split_k: int, fused: bool = False) -> int:
    """Input columns per K step: up to 128 (the chunk where `split_k` is smaller), fewer at
    large ranks so an A tile stays _TILE elements; half that where the program also holds a
    B tile (`fused`)."""
    tile = _TILE // 2 if fused else _TILE
    return max(16, min(split_k or 128, 128, tile // block_r))


@triton.jit
def _tile_rows(tiles_ptr, rows_ptr, ranks_ptr, tile, rank, BLOCK_M: tl.constexpr):
    """Tile `tile`'s slot, row count, its rows (int64, BLOCK_M; past the count: row 0,
    masked), the mask, and the slot's rank (at most `rank`)."""
    slot = tl.load(tiles_ptr + tile * 4).to(tl.int64)
    start = tl.load(tiles_ptr + tile * 4 + 1)
    count = tl.load(tiles_ptr + tile * 4 + 2)
    m = tl.arange(0, BLOCK_M)
    in_tile = m < count
    rows = tl.load(rows_ptr + start + m, mask=in_tile, other=0).to(tl.int64)
    row_rank = tl.minimum(tl.load(ranks_ptr + tl.maximum(slot, 0)), rank)
    return slot, count, rows, in_tile, row_rank


@triton.jit
def _shrink_step(x_rows, a_rows, in_tile, k0, in_size, row_rank, acc, BLOCK_R: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_R] += x[rows, k] @ A[:, k]^T for the BLOCK_K inputs from k0."""
    r = tl.arange(0, BLOCK_R)
    k = k0 + tl.arange(0, BLOCK_K)
    k_in = k < in_size
    xk = tl.load(x_rows + k[None, :], mask=in_tile[:, None] & k_in[None, :], other=0.0)
    ak = tl.load(a_rows + k[:, None], mask=k_in[:, None] & (r[None, :] < row_rank), other=0.0)
    return tile_dot(xk, ak, acc, DOT_F32, DOT_PRECISION)


@triton.jit
def _shrink_tile(x_ptr, a_rows, rows, in_tile, k_start, in_size, stride_x, row_rank, acc,
                 CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """acc += the tile's rows' products over CHUNK inputs from k_start, its steps unrolled
    (their loads issue together), or over every input from 0 when CHUNK is 0 (a loop)."""
    x_rows = x_ptr + rows[:, None] * stride_x
    if CHUNK > 0:
        for kk in tl.static_range(0, CHUNK, BLOCK_K):
            acc = _shrink_step(x_rows, a_rows, in_tile, k_start + kk, in_size, row_rank, acc, BLOCK_R,
                               BLOCK_K, DOT_F32, DOT_PRECISION)
    else:
        for k0 in range(0, scalar(in_size), BLOCK_K):
            acc = _shrink_step(x_rows, a_rows, in_tile, k0, in_size, row_rank, acc, BLOCK_R, BLOCK_K, DOT_F32,
                               DOT_PRECISION)
    return acc


@triton.jit
def _add_expanded_tile(h, b_ptr, out_ptr, rows, in_tile, slot, piece, row_rank, offsets_ptr, sizes_ptr,
                       stride_b_slot, stride_b_out, stride_out, BLOCK_R: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """out[rows, slice piece's block of outputs] += h @ B[slot]^T (fp32 products: the tile is
    small and the sums stay the per-row pair's)."""
    r = tl.arange(0, BLOCK_R)
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    offset = tl.load(offsets_ptr + piece)
    size = tl.load(sizes_ptr + piece)
    n_in = n < size
    w = tl.load(b_ptr + slot * stride_b_slot + (offset + n).to(tl.int64)[None, :] * stride_b_out + r[:, None],
                mask=n_in[None, :] & (r[:, None] < row_rank), other=0.0).to(tl.float32)
    delta = tl.dot(h, w, input_precision="ieee")
    ptrs = out_ptr + rows[:, None] * stride_out + offset + n[None, :]
    mask = in_tile[:, None] & n_in[None, :]
    current = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (current + delta).to(out_ptr.dtype.element_ty), mask=mask)


@jit()
def _grouped_shrink_kernel(
    x_ptr, a_ptr, tiles_ptr, rows_ptr, ranks_ptr, h_ptr,
    in_size, rank, stride_x, stride_a_piece, stride_a_slot, stride_a_rank, stride_h, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False,
):
    """h[row, split, piece's ranks] for each row of tile program_id(0): its chunk's partial."""
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    piece = tl.program_id(1)
    split = tl.program_id(2)
    slot, count, rows, in_tile, row_rank = _tile_rows(tiles_ptr, rows_ptr, ranks_ptr, tl.program_id(0), rank,
                                                      BLOCK_M)
    if count <= 0:  # an unused tile of a captured graph
        return
    r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + piece * stride_a_piece + slot * stride_a_slot + r.to(tl.int64)[None, :] * stride_a_rank
    acc = _shrink_tile(x_ptr, a_rows, rows, in_tile, split * SPLIT_K, in_size, stride_x, row_rank,
                       tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32), SPLIT_K, BLOCK_R, BLOCK_K, DOT_F32,
                       DOT_PRECISION)
    h_ptrs = h_ptr + rows[:, None] * stride_h + split * stride_split + piece * rank + r[None, :]
    tl.store(h_ptrs, acc, mask=in_tile[:, None] & (r[None, :] < rank))


@jit()
def _grouped_expand_kernel(
    h_ptr, b_ptr, tiles_ptr, rows_ptr, ranks_ptr, out_ptr, offsets_ptr, sizes_ptr,
    rank, num_splits, stride_h, stride_split, stride_b_slot, stride_b_out, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    piece = tl.program_id(1)
    slot, count, rows, in_tile, row_rank = _tile_rows(tiles_ptr, rows_ptr, ranks_ptr, tl.program_id(0), rank,
                                                      BLOCK_M)
    # An unused tile, or a block past a narrower slice's outputs (the grid covers the widest).
    if count <= 0 or tl.program_id(2) * BLOCK_N >= tl.load(sizes_ptr + piece):
        return
    r = tl.arange(0, BLOCK_R)
    h_rows = h_ptr + rows[:, None] * stride_h + piece * rank + r[None, :]
    h_mask = in_tile[:, None] & (r[None, :] < row_rank)
    h = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for split in range(0, scalar(num_splits)):  # the shrink's partial sums, one per chunk of K
        h += tl.load(h_rows + split * stride_split, mask=h_mask, other=0.0)
    _add_expanded_tile(h, b_ptr, out_ptr, rows, in_tile, slot, piece, row_rank, offsets_ptr, sizes_ptr,
                       stride_b_slot, stride_b_out, stride_out, BLOCK_R, BLOCK_N)


@jit()
def _grouped_fused_kernel(
    x_ptr, a_ptr, b_ptr, tiles_ptr, rows_ptr, ranks_ptr, out_ptr, offsets_ptr, sizes_ptr,
    in_size, rank, stride_x, stride_a_piece, stride_a_slot, stride_a_rank, stride_b_slot, stride_b_out,
    stride_out,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False,
):
    """Shrink and expand in one launch: each (tile, slice, output block) program computes its
    tile's h for the slice, then adds its block of h @ B^T."""
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    piece = tl.program_id(1)
    slot, count, rows, in_tile, row_rank = _tile_rows(tiles_ptr, rows_ptr, ranks_ptr, tl.program_id(0), rank,
                                                      BLOCK_M)
    if count <= 0 or tl.program_id(2) * BLOCK_N >= tl.load(sizes_ptr + piece):  # as the expand's
        return
    r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + piece * stride_a_piece + slot * stride_a_slot + r.to(tl.int64)[None, :] * stride_a_rank
    h = _shrink_tile(x_ptr, a_rows, rows, in_tile, 0, in_size, stride_x, row_rank,
                     tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32), 0, BLOCK_R, BLOCK_K, DOT_F32,
                     DOT_PRECISION)
    _add_expanded_tile(h, b_ptr, out_ptr, rows, in_tile, slot, piece, row_rank, offsets_ptr, sizes_ptr,
                       stride_b_slot, stride_b_out, stride_out, BLOCK_R, BLOCK_N)


def grouped_shrink(x: torch.Tensor, a: torch.Tensor, tiles: RowTiles, slot_ranks: torch.Tensor,
                   num_slices: int, rank: int, config: LoRAKernelConfig,
                   h: torch.Tensor | None = None) -> torch.Tensor:
    """h [x rows, splits, n * rank] in fp32 (shrink_partials' layout, indexed by x's row): each
    tiled row's partial sums per chunk of K; rows in no tile are left unwritten."""
    if h is None:
        h = shrink_partials(x, x.shape[0], num_slices, rank, config)
    block_r = grouped_block_r(rank)
    launch(_grouped_shrink_kernel, (tiles.tiles.shape[0], num_slices, h.shape[1]),
           x, a, tiles.tiles, tiles.rows, slot_ranks, h,
           x.shape[1], rank, x.stride(0), a.stride(0), a.stride(1), a.stride(2), h.stride(0), h.stride(1),
           BLOCK_M=GROUP_ROWS, BLOCK_R=block_r, BLOCK_K=grouped_block_k(block_r, config.split_k),
           SPLIT_K=config.split_k, num_warps=config.num_warps, **dot_flags(x.dtype))
    return h


def grouped_expand(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, tiles: RowTiles,
                   slot_ranks: torch.Tensor, output_sizes: list[int], rank: int, padded_rank: int,
                   config: LoRAKernelConfig) -> torch.Tensor:
    """out[tiled rows, slices] += B @ (h's partials summed), in place (b's rank dim contiguous)."""
    block_r = grouped_block_r(rank)
    offsets, sizes, block_n, grid = _output_blocks(out, output_sizes, tiles.tiles.shape[0], block_r, config)
    launch(_grouped_expand_kernel, grid,
           h, b, tiles.tiles, tiles.rows, slot_ranks, out, offsets, sizes,
           rank, h.shape[1], h.stride(0), h.stride(1), padded_rank, b.stride(0), out.stride(0),
           BLOCK_M=GROUP_ROWS, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=config.num_warps)
    return out


def grouped_fused(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tiles: RowTiles,
                  slot_ranks: torch.Tensor, output_sizes: list[int], rank: int,
                  config: LoRAKernelConfig) -> torch.Tensor:
    """out[tiled rows, slices] += B @ (A @ x), both halves in one launch (x's and b's last
    dims contiguous)."""
    block_r = grouped_block_r(rank)
    offsets, sizes, block_n, grid = _output_blocks(out, output_sizes, tiles.tiles.shape[0], block_r, config)
    launch(_grouped_fused_kernel, grid,
           x, a, b, tiles.tiles, tiles.rows, slot_ranks, out, offsets, sizes,
           x.shape[1], rank, x.stride(0), a.stride(0), a.stride(1), a.stride(2), a.shape[2], b.stride(0),
           out.stride(0),
           BLOCK_M=GROUP_ROWS, BLOCK_R=block_r, BLOCK_K=grouped_block_k(block_r, config.split_k, fused=True),
           BLOCK_N=block_n, num_warps=config.num_warps, **dot_flags(x.dtype))
    return out


def grouped_linear(x: torch.Tensor, base: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor,
                   b: torch.Tensor, tiles: RowTiles, slot_ranks: torch.Tensor, output_sizes: list[int],
                   rank: int, config: LoRAKernelConfig) -> torch.Tensor:
    """base(x) plus each tiled row's delta, in the config's launch form (lora.py's
    lora_linear_triton for the per-row pair: the same streams under `overlap`)."""
    if tiles.tiles.shape[0] == 0:  # an eager step none of whose rows has an adapter
        return base(x)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    if config.fused:
        return grouped_fused(x, base(x), a, b, tiles, slot_ranks, output_sizes, rank, config)
    streams = overlap_streams(x, config)
    if streams is None:
        h = grouped_shrink(x, a, tiles, slot_ranks, len(output_sizes), rank, config)
        return grouped_expand(base(x), h, b, tiles, slot_ranks, output_sizes, rank, a.shape[2], config)
    main, side = streams
    h = shrink_partials(x, x.shape[0], len(output_sizes), rank, config)  # allocated on the main stream
    side.wait_stream(main)
    with stream_context(side):
        grouped_shrink(x, a, tiles, slot_ranks, len(output_sizes), rank, config, h)
    out = base(x)
    main.wait_stream(side)
    return grouped_expand(out, h, b, tiles, slot_ranks, output_sizes, rank, a.shape[2], config)
