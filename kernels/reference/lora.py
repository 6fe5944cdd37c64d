"""LoRA's two halves over a batch of rows that each use one adapter slot (Punica's
shrink/expand, vLLM's punica_wrapper), in torch: the reference the Triton pair is held to,
and the CPU path.

Slot tensors have fixed shapes (zero-padded to the largest rank R the engine allows):
`a` [slots, n * R, in] stacks the n fused slices' A along the rank dim (slice i's A is
a[:, i*R : i*R+r]); `b` [slots, out, R] stacks their B along the output dim (slice i's B is
b[:, offset_i : offset_i + size_i]). B carries the adapter's scaling. Only the rows that
use an adapter are given (`rows`, with their slot in `row_slots`): base rows cost nothing.
`rank`: the largest rank among the step's adapters (the padding past it is not read).
"""

import torch


def lora_shrink(x: torch.Tensor, a: torch.Tensor, rows: torch.Tensor | None, row_slots: torch.Tensor,
                num_slices: int, rank: int) -> torch.Tensor:
    """h [L, n * rank]: h[j, i*rank : (i+1)*rank] = A_i[row_slots[j], :rank] @ x[rows[j]].
    `rows` None: every row of x, in order."""
    slots, stacked, width = a.shape
    padded = stacked // num_slices
    weights = a if rank == padded else a.view(slots, num_slices, padded, width)[:, :, :rank]
    weights = weights.index_select(0, row_slots).reshape(row_slots.shape[0], num_slices * rank, width)
    xs = x if rows is None else x.index_select(0, rows)
    return torch.bmm(weights, xs.unsqueeze(2).to(weights.dtype)).squeeze(2)


def lora_expand(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None,
                row_slots: torch.Tensor, output_sizes: list[int], rank: int) -> torch.Tensor:
    """out[rows[j], slice i] += B_i[row_slots[j], :, :rank] @ h[j, slice i's ranks], in place;
    returns out."""
    weights = b[:, :, :rank].index_select(0, row_slots)  # [L, out, rank]
    if len(output_sizes) == 1:
        delta = torch.bmm(weights, h.unsqueeze(2)).squeeze(2)
    else:
        parts, offset = [], 0
        for i, size in enumerate(output_sizes):
            parts.append(torch.bmm(weights[:, offset : offset + size], h[:, i * rank : (i + 1) * rank, None]))
            offset += size
        delta = torch.cat(parts, dim=1).squeeze(2)
    if rows is None:
        out.add_(delta.to(out.dtype))
    else:
        out.index_add_(0, rows, delta.to(out.dtype))
    return out


def lora_linear_delta(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                      rank: int) -> torch.Tensor:
    """out += each row's adapter delta (shrink, then expand); returns out."""
    h = lora_shrink(x, a, rows, row_slots, len(output_sizes), rank)
    return lora_expand(out, h, b, rows, row_slots, output_sizes, rank)
