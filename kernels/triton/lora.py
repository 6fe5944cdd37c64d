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
Import through `kernels.dispatch.lora_linear_delta`.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar

_BLOCK_K = 64  # input columns a shrink program reads at a time (at ranks up to 32)
_SHRINK_TILE = 2048  # A elements a shrink program holds per step: BLOCK_R x BLOCK_K


def shrink_block_k(block_r: int) -> int:
    """The shrink's K tile for a rank block: a 64 x 64 fp32 tile took 205-241 registers (of
    255) on sm_80-90, so larger ranks read narrower K tiles."""
    return max(16, min(_BLOCK_K, _SHRINK_TILE // block_r))
_BLOCK_N = 64  # output columns an expand program writes


@jit(do_not_specialize=("num_rows",))
def _lora_shrink_kernel(
    x_ptr, a_ptr, rows_ptr, slots_ptr, ranks_ptr, h_ptr,
    num_rows, in_size, rank, stride_x, stride_a_piece, stride_a_slot, stride_a_rank, stride_h,
    HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    j = tl.program_id(0)
    piece = tl.program_id(1)  # the fused slice
    if HAS_ROWS:
        token = tl.load(rows_ptr + j).to(tl.int64)
    else:
        token = j.to(tl.int64)
    slot = tl.load(slots_ptr + j).to(tl.int64)
    if slot < 0:  # no adapter: nothing to read (expand skips the row too)
        return
    if HAS_RANKS:
        row_rank = tl.minimum(tl.load(ranks_ptr + slot), rank)
    else:
        row_rank = rank
    r = tl.arange(0, BLOCK_R)
    a_rows = a_ptr + piece * stride_a_piece + slot * stride_a_slot + r.to(tl.int64)[:, None] * stride_a_rank
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, scalar(in_size), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + token * stride_x + k, mask=k < in_size, other=0.0).to(tl.float32)
        w = tl.load(a_rows + k[None, :], mask=(r[:, None] < row_rank) & (k[None, :] < in_size),
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * xk[None, :], axis=1)
    tl.store(h_ptr + j.to(tl.int64) * stride_h + piece * rank + r, acc, mask=r < rank)


@jit(do_not_specialize=("num_rows",))
def _lora_expand_kernel(
    h_ptr, b_ptr, rows_ptr, slots_ptr, ranks_ptr, out_ptr, offsets_ptr, sizes_ptr,
    num_rows, rank, stride_h, stride_b_slot, stride_b_out, stride_out,
    HAS_ROWS: tl.constexpr, HAS_RANKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    j = tl.program_id(0)
    piece = tl.program_id(1)
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_ROWS:
        token = tl.load(rows_ptr + j).to(tl.int64)
    else:
        token = j.to(tl.int64)
    slot = tl.load(slots_ptr + j).to(tl.int64)
    if slot < 0:  # a base or padding row: its output stays as it is
        return
    if HAS_RANKS:
        row_rank = tl.minimum(tl.load(ranks_ptr + slot), rank)
    else:
        row_rank = rank
    offset = tl.load(offsets_ptr + piece)
    size = tl.load(sizes_ptr + piece)
    r = tl.arange(0, BLOCK_R)
    hv = tl.load(h_ptr + j.to(tl.int64) * stride_h + piece * rank + r, mask=r < row_rank, other=0.0)
    w = tl.load(b_ptr + slot * stride_b_slot + (offset + n).to(tl.int64)[:, None] * stride_b_out + r[None, :],
                mask=(n[:, None] < size) & (r[None, :] < row_rank), other=0.0).to(tl.float32)
    delta = tl.sum(w * hv[None, :], axis=1)
    # Each (row, column) belongs to one program: a plain read-add-write.
    ptrs = out_ptr + token * stride_out + offset + n
    mask = n < size
    current = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (current + delta).to(out_ptr.dtype.element_ty), mask=mask)


_SLICES: dict[tuple[tuple[int, ...], torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _slices(output_sizes: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (tuple(output_sizes), device)
    if key not in _SLICES:
        offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        _SLICES[key] = (torch.tensor(offsets, dtype=torch.int32, device=device),
                        torch.tensor(output_sizes, dtype=torch.int32, device=device))
    return _SLICES[key]


def lora_shrink_triton(x: torch.Tensor, a: torch.Tensor, rows: torch.Tensor | None, row_slots: torch.Tensor,
                       num_slices: int, rank: int, slot_ranks: torch.Tensor | None = None) -> torch.Tensor:
    """h [L, n * rank] in fp32: h[j, i*rank : (i+1)*rank] = A_i[row_slots[j], :rank] @ x[rows[j]]
    (a row of a negative slot: left unwritten)."""
    num_rows = row_slots.shape[0]
    h = torch.empty(num_rows, num_slices * rank, dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return h
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_r = max(2, triton.next_power_of_2(rank))
    launch(_lora_shrink_kernel, (num_rows, num_slices),
           x, a, rows if rows is not None else row_slots, row_slots,
           slot_ranks if slot_ranks is not None else row_slots, h,
           num_rows, x.shape[1], rank, x.stride(0), a.stride(0), a.stride(1), a.stride(2), h.stride(0),
           HAS_ROWS=rows is not None, HAS_RANKS=slot_ranks is not None,
           BLOCK_R=block_r, BLOCK_K=shrink_block_k(block_r))
    return h


def lora_expand_triton(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None,
                       row_slots: torch.Tensor, output_sizes: list[int], rank: int,
                       padded_rank: int, slot_ranks: torch.Tensor | None = None) -> torch.Tensor:
    """out[rows, slices] += B @ h, in place; b [out, slots * R] (kernels/reference/lora.py)."""
    num_rows = row_slots.shape[0]
    if num_rows == 0:
        return out
    if out.stride(-1) != 1:
        raise ValueError("lora_expand_triton writes rows of a tensor whose last dim is contiguous")
    offsets, sizes = _slices(output_sizes, out.device)
    grid = (num_rows, len(output_sizes), triton.cdiv(max(output_sizes), _BLOCK_N))
    if b.stride(1) != 1:
        b = b.contiguous()
    launch(_lora_expand_kernel, grid,
           h, b, rows if rows is not None else row_slots, row_slots,
           slot_ranks if slot_ranks is not None else row_slots, out, offsets, sizes,
           num_rows, rank, h.stride(0), padded_rank, b.stride(0), out.stride(0),
           HAS_ROWS=rows is not None, HAS_RANKS=slot_ranks is not None,
           BLOCK_R=max(2, triton.next_power_of_2(rank)), BLOCK_N=_BLOCK_N)
    return out


def lora_linear_delta_triton(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                             rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                             rank: int, slot_ranks: torch.Tensor | None = None) -> torch.Tensor:
    h = lora_shrink_triton(x, a, rows, row_slots, len(output_sizes), rank, slot_ranks)
    return lora_expand_triton(out, h, b, rows, row_slots, output_sizes, rank, a.shape[2], slot_ranks)
