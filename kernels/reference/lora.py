"""LoRA's two halves over a batch of rows that each use one adapter slot (Punica's
shrink/expand, vLLM's punica_wrapper), in torch: the reference the Triton pair is held to,
and the CPU path.

Slot tensors have fixed shapes, zero-padded to the largest rank R the engine allows:
- `a` [slots, n * R, in]: the n fused slices' A stacked along the rank dim (slot s, slice
  i's A is a[s, i*R : i*R + r]);
- `b` [out, slots * R]: the slices' B stacked along the output dim, the slots side by side
  along the rank dim (slot s, slice i's B is b[offset_i : offset_i + size_i, s*R : s*R + r]),
  so one GEMM expands every slot at once. B carries the adapter's scaling.
Only the rows that use an adapter are given (`rows`, their slot in `row_slots`): base rows
cost nothing; given every row (`rows` None), a row whose slot is -1 gets no delta. `rank`:
the largest rank among the step's adapters; `num_slots`: the step's adapters sit in slots
[0, num_slots) (the padding past either is not computed).

On the CPU a handful of large GEMMs beats a loop of small ones: the shrink runs every slot
for every adapter row (A is small), each row keeps its own slot's ranks (a mask), and the
expand is one GEMM over every slot's ranks (the others' are zero for that row).
"""

import torch


def _slot_weights(a: torch.Tensor, b: torch.Tensor, num_slices: int, rank: int,
                  num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A of the step's slots as [num_slots * n * rank, in], B as [out, num_slots * rank]."""
    slots, stacked, width = a.shape
    padded = stacked // num_slices
    if rank == padded:  # views
        return a[:num_slots].reshape(num_slots * stacked, width), b[:, : num_slots * padded]
    a_w = a[:num_slots].view(num_slots, num_slices, padded, width)[:, :, :rank]
    b_w = b.view(b.shape[0], slots, padded)[:, :num_slots, :rank]
    return a_w.reshape(-1, width), b_w.reshape(b.shape[0], num_slots * rank)


_last_mask: tuple[torch.Tensor, int, torch.Tensor] | None = None  # every layer of a step shares it


def _own_slot_mask(row_slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """[L, num_slots, 1, 1]: 1 where the column's slot is the row's own."""
    global _last_mask
    if _last_mask is not None and _last_mask[0] is row_slots and _last_mask[1] == num_slots:
        return _last_mask[2]
    mask = (row_slots[:, None] == torch.arange(num_slots, device=row_slots.device))[:, :, None, None]
    _last_mask = (row_slots, num_slots, mask)
    return mask


def lora_linear_delta(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                      rank: int, num_slots: int | None = None) -> torch.Tensor:
    """out += each adapter row's delta (shrink, then expand); returns out. `num_slots`: the
    step's adapters sit in slots [0, num_slots) (None: every slot)."""
    num_slices = len(output_sizes)
    num_slots = a.shape[0] if num_slots is None else num_slots
    a_w, b_w = _slot_weights(a, b, num_slices, rank, num_slots)
    xs = x if rows is None else x.index_select(0, rows)
    num_rows = xs.shape[0]
    h = torch.mm(xs.to(a.dtype), a_w.t()).view(num_rows, num_slots, num_slices, rank)
    h = h * _own_slot_mask(row_slots, num_slots)  # each row keeps its own slot's ranks
    if num_slices == 1:
        delta = torch.mm(h.view(num_rows, num_slots * rank), b_w.t())
    else:
        parts, offset = [], 0
        for i, size in enumerate(output_sizes):
            slice_h = h[:, :, i].reshape(num_rows, num_slots * rank)
            parts.append(torch.mm(slice_h, b_w[offset : offset + size].t()))
            offset += size
        delta = torch.cat(parts, dim=1)
    if rows is None:
        out.add_(delta.to(out.dtype))
    else:
        out.index_add_(0, rows, delta.to(out.dtype))
    return out
