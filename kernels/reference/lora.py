"""LoRA's two halves over a batch of rows that each use one adapter slot (Punica's
shrink/expand, vLLM's punica_wrapper), in torch: the reference the Triton pair is held to,
and the CPU path.

Slot tensors have fixed shapes, zero-padded to the largest rank R the engine allows:
- `a` [n, slots, R, in]: the n fused slices' A (slot s, slice i's A is a[i, s, :r]);
- `b` [out, slots * R]: the slices' B stacked along the output dim, the slots side by side
  along the rank dim (slot s, slice i's B is b[offset_i : offset_i + size_i, s*R : s*R + r]),
  so one GEMM expands every slot at once. B carries the adapter's scaling.
Only the rows that use an adapter are given (`rows`, their slot in `row_slots`): base rows
cost nothing; given every row (`rows` None), a row whose slot is -1 gets no delta. `rank`:
the largest rank among the step's adapters; `num_slots`: the step's adapters sit in slots
[0, num_slots) (the padding past either is not computed).

On the CPU a few large GEMMs beat a loop of small ones: one batched GEMM shrinks every slot
for every adapter row (A is small), a mask keeps each row's own slot's ranks, and one GEMM
per slice expands every slot at once (the others' ranks are zero for that row), added in
place into the output's slice when every row is given.
"""

import torch


def _slot_weights(a: torch.Tensor, b: torch.Tensor, rank: int,
                  num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A of the step's slots as [n, num_slots * rank, in], B as [out, num_slots * rank]."""
    num_slices, slots, padded, width = a.shape
    if rank == padded:  # views
        return a[:, :num_slots].reshape(num_slices, num_slots * padded, width), b[:, : num_slots * padded]
    a_w = a[:, :num_slots, :rank].reshape(num_slices, num_slots * rank, width)
    b_w = b.view(b.shape[0], slots, padded)[:, :num_slots, :rank]
    return a_w, b_w.reshape(b.shape[0], num_slots * rank)


_last_mask: tuple[torch.Tensor, int, torch.Tensor] | None = None  # every layer of a step shares it


def _own_slot_mask(row_slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """[L, num_slots, 1]: 1 where the column's slot is the row's own."""
    global _last_mask
    if _last_mask is not None and _last_mask[0] is row_slots and _last_mask[1] == num_slots:
        return _last_mask[2]
    mask = (row_slots[:, None] == torch.arange(num_slots, device=row_slots.device))[:, :, None]
    _last_mask = (row_slots, num_slots, mask)
    return mask


def lora_linear_delta(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                      rank: int, num_slots: int | None = None) -> torch.Tensor:
    """out += each adapter row's delta (shrink, then expand); returns out. `num_slots`: the
    step's adapters sit in slots [0, num_slots) (None: every slot)."""
    num_slices = len(output_sizes)
    num_slots = a.shape[1] if num_slots is None else num_slots
    a_w, b_w = _slot_weights(a, b, rank, num_slots)
    xs = x if rows is None else x.index_select(0, rows)
    num_rows = xs.shape[0]
    h = torch.matmul(xs.to(a.dtype), a_w.transpose(1, 2))  # [n, L, num_slots * rank]
    h = (h.view(num_slices, num_rows, num_slots, rank) * _own_slot_mask(row_slots, num_slots))
    h = h.view(num_slices, num_rows, num_slots * rank)  # each row keeps its own slot's ranks
    if rows is None and out.dtype == h.dtype:  # straight into the output's slices
        offset = 0
        for i, size in enumerate(output_sizes):
            out[:, offset : offset + size].addmm_(h[i], b_w[offset : offset + size].t())
            offset += size
        return out
    parts, offset = [], 0
    for i, size in enumerate(output_sizes):
        parts.append(torch.mm(h[i], b_w[offset : offset + size].t()))
        offset += size
    delta = parts[0] if num_slices == 1 else torch.cat(parts, dim=1)
    if rows is None:
        out.add_(delta.to(out.dtype))
    else:
        out.index_add_(0, rows, delta.to(out.dtype))
    return out
