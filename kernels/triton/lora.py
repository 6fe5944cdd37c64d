"""Triton LoRA shrink/expand (Punica's BGMV, as vLLM's punica kernels): one program per
adapter row (and fused slice, and block of outputs) reads its slot's A or B, so rows of
different adapters share one launch and base rows are not launched at all. Same contract
as kernels/reference/lora.py (slot layout, `rows`, `row_slots`, `rank`); sums in fp32. Each
program reads only its row's slot, so the step's slot count does not matter here.
A row whose slot is negative (a base row, or a padding row of a captured decode graph,
which gives every row) gets nothing: its programs return before reading a slot. With
`slot_ranks` (int32 [slots], the decode graphs' form, captured at max_lora_rank) each row
reads only its own adapter's ranks of A and B: `rank` is then the h row stride and an upper
bound, and the slot's zero padding past its rank is never loaded.
How they launch (lora_plan.py's LoRAKernelConfig): the shrink splits a row's input columns
into `split_k` chunks, one program each, and writes each chunk's partial h; the expand adds
the partials as it reads them. `fused` runs one kernel that does both per output block.
`overlap` launches the shrink on a side stream while the layer's base GEMM runs (it reads
only x), joining before the expand: in a captured graph the two are parallel branches.
Import through `kernels.dispatch.lora_linear`.
"""

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.launch import device_arch, jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.lora_plan import DEFAULT_CONFIG, LoRAKernelConfig, lora_kernel_config
from kvdeck.kernels.triton.pdl import pdl_start

_BLOCK_K = 64  # input columns a shrink program reads at a time (at ranks up to 32)
_SHRINK_TILE = 2048  # A elements a shrink program holds per step: BLOCK_R x BLOCK_K
# ... when it covers a chunk of `split_k` inputs: one tile of a chunk has every load in flight
# before the first multiply (sm_90 SASS, triton 3.9: 7 of 7 at rank 16 and 256 inputs, A and x
# in 128-bit loads; triton 3.6: 5 of 7), where four unrolled 64-wide tiles had 11 of 38, the
# rest waiting on the first tile's sums. A chunk of 256 inputs is one tile up to rank 64 (512
# up to rank 32; sm_90, rank 64: 19 of 19 loads first, 96 registers, where 64-wide tiles had 5
# of 22); no spill on sm_80-90 with triton 3.6 or 3.9, the sweep's 512 split included.
_CHUNK_TILE = 16384
_EXPAND_TILE = 4096  # B elements an expand program holds: BLOCK_N x BLOCK_R


def shrink_block_k(block_r: int, split_k: int = 0) -> int:
    """The shrink's K tile for a rank block: a 64 x 64 fp32 tile took 205-241 registers (of
    255) on sm_80-90, so larger ranks read narrower K tiles. With chunks of `split_k` inputs
    (a power of two), whole tiles per chunk, as wide as _CHUNK_TILE allows."""
    if split_k:
        return max(16, min(split_k, _CHUNK_TILE // block_r))
    return max(16, min(_BLOCK_K, _SHRINK_TILE // block_r))


def fused_block_k(block_r: int, config: LoRAKernelConfig) -> int:
    """The fused kernel's K tile: it holds a B tile beside, so half what the shrink's may be
    (rank 64: 128 inputs, 96 registers on sm_90; a whole 256-input chunk took 128-167, no
    spill either way)."""
    return max(16, min(config.split_k or _BLOCK_K, _CHUNK_TILE // 2 // block_r))


def expand_block_n(block_r: int, config: LoRAKernelConfig) -> int:
    """The expand's output block: the config's, narrower at large ranks (the B tile's size)."""
    return max(16, min(config.block_n, _EXPAND_TILE // block_r))


def _block_r(rank: int) -> int:
    return max(2, triton.next_power_of_2(rank))


@triton.jit
def _a_chunk_dot(x_row, a_rows, k_start, in_size, row_rank, r, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr):
    """sum over k in [k_start, k_start + CHUNK) of A[r, k] * x[k], in fp32, its tiles unrolled
    (one tile a chunk where shrink_block_k allows: only then are all its loads issued before
    the first multiply waits)."""
    acc = tl.zeros(r.shape, dtype=tl.float32)
    for kk in tl.static_range(0, CHUNK, BLOCK_K):
        k = k_start + kk + tl.arange(0, BLOCK_K)
        xk = tl.load(x_row + k, mask=k < in_size, other=0.0).to(tl.float32)
        w = tl.load(a_rows + k[None, :], mask=(r[:, None] < row_rank) & (k[None, :] < in_size),
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * xk[None, :], axis=1)
    return acc


@triton.jit
def _row_and_slot(rows_ptr, slots_ptr, ranks_ptr, j, rank, HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr):
    """Program j's token row, its slot (negative: none) and the ranks it reads."""
    if HAS_ROWS:
        token = tl.load(rows_ptr + j).to(tl.int64)
    else:
        token = j.to(tl.int64)
    slot = tl.load(slots_ptr + j).to(tl.int64)
    if HAS_RANKS:
        row_rank = tl.minimum(tl.load(ranks_ptr + tl.maximum(slot, 0)), rank)
    else:
        row_rank = rank
    return token, slot, row_rank


@jit(do_not_specialize=("num_rows",))
def _lora_shrink_kernel(
    x_ptr, a_ptr, rows_ptr, slots_ptr, ranks_ptr, h_ptr,
    num_rows, in_size, rank, stride_x, stride_a_piece, stride_a_slot, stride_a_rank, stride_h, stride_split,
    HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    j = tl.program_id(0)
    piece = tl.program_id(1)  # the fused slice
    split = tl.program_id(2)  # the chunk of input columns (SPLIT_K > 0)
    token, slot, row_rank = _row_and_slot(rows_ptr, slots_ptr, ranks_ptr, j, rank, HAS_ROWS, HAS_RANKS)
    if slot < 0:  # no adapter: nothing to read (expand skips the row too)
        return
    r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + piece * stride_a_piece + slot * stride_a_slot + r.to(tl.int64)[:, None] * stride_a_rank
    x_row = x_ptr + token * stride_x
    if SPLIT_K > 0:
        acc = _a_chunk_dot(x_row, a_rows, split * SPLIT_K, in_size, row_rank, r, SPLIT_K, BLOCK_K)
    else:
        acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for k0 in range(0, scalar(in_size), BLOCK_K):
            acc += _a_chunk_dot(x_row, a_rows, k0, in_size, row_rank, r, BLOCK_K, BLOCK_K)
    tl.store(h_ptr + j.to(tl.int64) * stride_h + split * stride_split + piece * rank + r, acc, mask=r < rank)


@triton.jit
def _add_expanded(hv, b_ptr, out_ptr, token, slot, piece, row_rank, r, offsets_ptr, sizes_ptr,
                  stride_b_slot, stride_b_out, stride_out, BLOCK_N: tl.constexpr):
    """out[token, slice piece's block of outputs] += B[slot] @ hv (each (row, column) is one
    program's: a plain read-add-write)."""
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    offset = tl.load(offsets_ptr + piece)
    size = tl.load(sizes_ptr + piece)
    w = tl.load(b_ptr + slot * stride_b_slot + (offset + n).to(tl.int64)[:, None] * stride_b_out + r[None, :],
                mask=(n[:, None] < size) & (r[None, :] < row_rank), other=0.0).to(tl.float32)
    delta = tl.sum(w * hv[None, :], axis=1)
    ptrs = out_ptr + token * stride_out + offset + n
    mask = n < size
    current = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (current + delta).to(out_ptr.dtype.element_ty), mask=mask)


@jit(do_not_specialize=("num_rows",))
def _lora_expand_kernel(
    h_ptr, b_ptr, rows_ptr, slots_ptr, ranks_ptr, out_ptr, offsets_ptr, sizes_ptr,
    num_rows, rank, num_splits, stride_h, stride_split, stride_b_slot, stride_b_out, stride_out,
    HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    j = tl.program_id(0)
    piece = tl.program_id(1)
    token, slot, row_rank = _row_and_slot(rows_ptr, slots_ptr, ranks_ptr, j, rank, HAS_ROWS, HAS_RANKS)
    # A base or padding row (its output stays as it is), or a block past a narrower slice's
    # outputs (the grid covers the widest: k/v beside q).
    if slot < 0 or tl.program_id(2) * BLOCK_N >= tl.load(sizes_ptr + piece):
        return
    r = tl.arange(0, BLOCK_R)
    # The shrink's partial sums, one per chunk of K, in one load (a loop over them waited on
    # each in turn): SPLITS is their count's power of two.
    split = tl.arange(0, SPLITS)
    h_row = h_ptr + j.to(tl.int64) * stride_h + piece * rank
    partials = tl.load(h_row + split[:, None] * stride_split + r[None, :],
                       mask=(split[:, None] < num_splits) & (r[None, :] < row_rank), other=0.0)
    hv = tl.sum(partials, axis=0)
    _add_expanded(hv, b_ptr, out_ptr, token, slot, piece, row_rank, r, offsets_ptr, sizes_ptr,
                  stride_b_slot, stride_b_out, stride_out, BLOCK_N)


@jit(do_not_specialize=("num_rows",))
def _lora_fused_kernel(
    x_ptr, a_ptr, b_ptr, rows_ptr, slots_ptr, ranks_ptr, out_ptr, offsets_ptr, sizes_ptr,
    num_rows, in_size, rank, stride_x, stride_a_piece, stride_a_slot, stride_a_rank,
    stride_b_slot, stride_b_out, stride_out,
    HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    """Shrink and expand in one launch: each (row, slice, output block) program computes its
    row's h for the slice, then adds its block of B @ h."""
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    j = tl.program_id(0)
    piece = tl.program_id(1)
    token, slot, row_rank = _row_and_slot(rows_ptr, slots_ptr, ranks_ptr, j, rank, HAS_ROWS, HAS_RANKS)
    if slot < 0 or tl.program_id(2) * BLOCK_N >= tl.load(sizes_ptr + piece):  # as the expand's
        return
    r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + piece * stride_a_piece + slot * stride_a_slot + r.to(tl.int64)[:, None] * stride_a_rank
    x_row = x_ptr + token * stride_x
    hv = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, scalar(in_size), CHUNK):
        hv += _a_chunk_dot(x_row, a_rows, k0, in_size, row_rank, r, CHUNK, BLOCK_K)
    _add_expanded(hv, b_ptr, out_ptr, token, slot, piece, row_rank, r, offsets_ptr, sizes_ptr,
                  stride_b_slot, stride_b_out, stride_out, BLOCK_N)


_SLICES: dict[tuple[tuple[int, ...], torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _slices(output_sizes: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (tuple(output_sizes), device)
    if key not in _SLICES:
        offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        _SLICES[key] = (torch.tensor(offsets, dtype=torch.int32, device=device),
                        torch.tensor(output_sizes, dtype=torch.int32, device=device))
    return _SLICES[key]


def _output_blocks(out: torch.Tensor, output_sizes: list[int], num_rows: int, block_r: int,
                   config: LoRAKernelConfig) -> tuple[torch.Tensor, torch.Tensor, int, tuple[int, int, int]]:
    """What the expand and fused launches share: the slices' offsets and sizes, the output
    block, and the grid (row, slice, block of the widest slice)."""
    if out.stride(-1) != 1:
        raise ValueError("the LoRA kernels write rows of a tensor whose last dim is contiguous")
    offsets, sizes = _slices(output_sizes, out.device)
    block_n = expand_block_n(block_r, config)
    return offsets, sizes, block_n, (num_rows, len(output_sizes), triton.cdiv(max(output_sizes), block_n))


def fused_chunk(block_k: int, config: LoRAKernelConfig) -> int:
    """Input columns the fused kernel covers per unrolled step (whole tiles)."""
    return max(block_k, config.split_k)


def shrink_partials(x: torch.Tensor, num_rows: int, num_slices: int, rank: int,
                    config: LoRAKernelConfig) -> torch.Tensor:
    """The shrink's output buffer h [L, splits, n * rank], fp32 (uninitialised)."""
    splits = config.num_splits(x.shape[1])
    return torch.empty(num_rows, splits, num_slices * rank, dtype=torch.float32, device=x.device)


def lora_shrink_triton(x: torch.Tensor, a: torch.Tensor, rows: torch.Tensor | None, row_slots: torch.Tensor,
                       num_slices: int, rank: int, slot_ranks: torch.Tensor | None = None,
                       config: LoRAKernelConfig = DEFAULT_CONFIG,
                       h: torch.Tensor | None = None) -> torch.Tensor:
    """h [L, splits, n * rank] in fp32, each split's partial sums (their total:
    h[j, :, i*rank : (i+1)*rank].sum(1) = A_i[row_slots[j], :rank] @ x[rows[j]]); a row of a
    negative slot is left unwritten. `h`: shrink_partials' buffer to write (None: a new one)."""
    num_rows = row_slots.shape[0]
    if h is None:
        h = shrink_partials(x, num_rows, num_slices, rank, config)
    splits = h.shape[1]
    if num_rows == 0:
        return h
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_r = _block_r(rank)
    block_k = shrink_block_k(block_r, config.split_k)
    launch(_lora_shrink_kernel, (num_rows, num_slices, splits),
           x, a, rows if rows is not None else row_slots, row_slots,
           slot_ranks if slot_ranks is not None else row_slots, h,
           num_rows, x.shape[1], rank, x.stride(0), a.stride(0), a.stride(1), a.stride(2), h.stride(0),
           h.stride(1), HAS_ROWS=rows is not None, HAS_RANKS=slot_ranks is not None,
           BLOCK_R=block_r, BLOCK_K=block_k, SPLIT_K=config.split_k, num_warps=config.num_warps)
    return h


def lora_expand_triton(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None,
                       row_slots: torch.Tensor, output_sizes: list[int], rank: int,
                       padded_rank: int, slot_ranks: torch.Tensor | None = None,
                       config: LoRAKernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """out[rows, slices] += B @ (h's partials summed), in place; b [out, slots * R]
    (kernels/reference/lora.py)."""
    num_rows = row_slots.shape[0]
    if num_rows == 0:
        return out
    block_r = _block_r(rank)
    offsets, sizes, block_n, grid = _output_blocks(out, output_sizes, num_rows, block_r, config)
    if b.stride(1) != 1:
        b = b.contiguous()
    launch(_lora_expand_kernel, grid,
           h, b, rows if rows is not None else row_slots, row_slots,
           slot_ranks if slot_ranks is not None else row_slots, out, offsets, sizes,
           num_rows, rank, h.shape[1], h.stride(0), h.stride(1), padded_rank, b.stride(0), out.stride(0),
           HAS_ROWS=rows is not None, HAS_RANKS=slot_ranks is not None,
           BLOCK_R=block_r, BLOCK_N=block_n, SPLITS=triton.next_power_of_2(h.shape[1]),
           num_warps=config.num_warps)
    return out


def lora_fused_triton(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                      rank: int, slot_ranks: torch.Tensor | None = None,
                      config: LoRAKernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """out[rows, slices] += B @ (A @ x), both halves in one launch."""
    num_rows = row_slots.shape[0]
    if num_rows == 0:
        return out
    block_r = _block_r(rank)
    offsets, sizes, block_n, grid = _output_blocks(out, output_sizes, num_rows, block_r, config)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if b.stride(1) != 1:
        b = b.contiguous()
    block_k = fused_block_k(block_r, config)
    launch(_lora_fused_kernel, grid,
           x, a, b, rows if rows is not None else row_slots, row_slots,
           slot_ranks if slot_ranks is not None else row_slots, out, offsets, sizes,
           num_rows, x.shape[1], rank, x.stride(0), a.stride(0), a.stride(1), a.stride(2),
           a.shape[2], b.stride(0), out.stride(0),
           HAS_ROWS=rows is not None, HAS_RANKS=slot_ranks is not None,
           BLOCK_R=block_r, BLOCK_K=block_k, CHUNK=fused_chunk(block_k, config), BLOCK_N=block_n,
           num_warps=config.num_warps)
    return out


def lora_linear_delta_triton(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                             rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                             rank: int, slot_ranks: torch.Tensor | None = None,
                             config: LoRAKernelConfig | None = None) -> torch.Tensor:
    """out += each adapter row's delta, on the current stream; `config` None: the device's
    (lora_plan.lora_kernel_config)."""
    if config is None:
        config = lora_kernel_config(device_arch(x.device))
    if config.fused:
        return lora_fused_triton(x, out, a, b, rows, row_slots, output_sizes, rank, slot_ranks, config)
    h = lora_shrink_triton(x, a, rows, row_slots, len(output_sizes), rank, slot_ranks, config)
    return lora_expand_triton(out, h, b, rows, row_slots, output_sizes, rank, a.shape[2], slot_ranks, config)


_SIDE_STREAMS: dict[torch.device, "torch.cuda.Stream"] = {}


def side_stream(device: torch.device) -> "torch.cuda.Stream":
    """The stream the overlapped shrinks run on (one per device, high priority: the expand
    waits on the shrink, the base GEMM beside it does not)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device, priority=-1)
    return _SIDE_STREAMS[device]


def lora_linear_triton(x: torch.Tensor, base: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor,
                       b: torch.Tensor, rows: torch.Tensor | None, row_slots: torch.Tensor,
                       output_sizes: list[int], rank: int, slot_ranks: torch.Tensor | None = None,
                       config: LoRAKernelConfig | None = None) -> torch.Tensor:
    """base(x) plus each adapter row's delta. Under `config.overlap` on CUDA the shrink runs
    on a side stream while `base` runs on the current one (fork after x is written, join
    before the expand); a captured graph holds them as parallel branches."""
    if config is None:
        config = lora_kernel_config(device_arch(x.device))
    streams = overlap_streams(x, config) if row_slots.shape[0] else None
    if streams is None:
        return lora_linear_delta_triton(x, base(x), a, b, rows, row_slots, output_sizes, rank, slot_ranks,
                                        config)
    main, side = streams
    if x.stride(-1) != 1:  # copied here, on the main stream, not inside the side's launch
        x = x.contiguous()
    # Allocated on the main stream, which reads it after the join: no cross-stream frees.
    h = shrink_partials(x, row_slots.shape[0], len(output_sizes), rank, config)
    side.wait_stream(main)
    with stream_context(side):
        lora_shrink_triton(x, a, rows, row_slots, len(output_sizes), rank, slot_ranks, config, h)
    out = base(x)
    main.wait_stream(side)
    return lora_expand_triton(out, h, b, rows, row_slots, output_sizes, rank, a.shape[2], slot_ranks, config)


def overlap_streams(x: torch.Tensor, config: LoRAKernelConfig) -> tuple | None:
    """(current stream, side stream) when `config` overlaps the shrink and x is on CUDA."""
    if not (config.overlap and x.is_cuda):
        return None
    return torch.cuda.current_stream(x.device), side_stream(x.device)


stream_context = torch.cuda.stream  # the launches inside run on the given stream
