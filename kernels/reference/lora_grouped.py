"""LoRA on the CPU with the step's rows grouped by adapter: each row is shrunk and expanded by
its own adapter only (kernels/reference/lora.py computes every slot for every row, masked).

A step groups its adapter rows by slot once (`group_rows`); each linear then costs a gather,
one batched shrink GEMM over the groups (the fused slices' A side by side: q/k/v or gate/up
in one GEMM), one batched expand GEMM (B block-diagonal over the slices, so the slices'
outputs come out side by side) and a scatter-add into the output. Groups of nearly equal
size (decode) are padded to one size and run as a batch; very unequal groups (a prefill
chunk beside decode rows) run one after another, so no padding is computed.
`grouped_weights` lays a layer's slots out this way (the caller keeps them while the slots
do not change).
"""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class RowGroups:
    """A step's adapter rows by slot (every linear of the step shares it)."""

    slots: tuple[int, ...]  # the step's slots in use, ascending
    # int64 [S * M] (padded) or [rows] (one group after another); None: every row, in order
    index: torch.Tensor | None
    valid: torch.Tensor | None  # [S, M, 1]: 0 for padding rows (None: no padding)
    rows_per_slot: int  # M (padded), 0 when the groups run one after another
    bounds: tuple[int, ...]  # group i is index[bounds[i] : bounds[i + 1]] (one after another)


def group_rows(token_slots: np.ndarray, dtype: torch.dtype, device: torch.device) -> RowGroups | None:
    """Group the rows whose slot is >= 0 by slot; None when no row has one."""
    rows = np.flatnonzero(token_slots >= 0)
    if rows.size == 0:
        return None
    order = rows[np.argsort(token_slots[rows], kind="stable")]
    slots, counts = np.unique(token_slots[order], return_counts=True)
    num_slots, most = len(slots), int(counts.max())
    if num_slots == 1 and rows.size == token_slots.size:  # every row, one adapter: no gather
        return RowGroups((int(slots[0]),), None, None, rows.size, (0, rows.size))
    padding = num_slots * most - rows.size
    if 4 * padding > rows.size:  # unequal groups: one after another
        bounds = (0, *np.cumsum(counts).tolist())
        return RowGroups(tuple(slots.tolist()), torch.from_numpy(order).to(device), None, 0, bounds)
    index = np.empty((num_slots, most), dtype=np.int64)
    valid = np.zeros((num_slots, most, 1), dtype=np.float32)
    start = 0
    for i, count in enumerate(counts.tolist()):
        index[i, :count] = order[start : start + count]
        index[i, count:] = order[start]  # a real row, its delta zeroed by `valid`
        valid[i, :count] = 1.0
        start += count
    return RowGroups(tuple(slots.tolist()), torch.from_numpy(index.reshape(-1)).to(device),
                     torch.from_numpy(valid).to(device=device, dtype=dtype) if padding else None, most, ())


def grouped_weights(a: torch.Tensor, b: torch.Tensor, output_sizes: list[int], rank: int,
                    slots: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """From the slot layout (a [n, slots, R, in], b [out, slots * R]): A of `slots` as
    [S, n * rank, in] (the slices' A stacked) and B as [S, n * rank, out], block-diagonal
    (slice i's ranks feed only slice i's outputs)."""
    num_slices, total_slots, padded, _ = a.shape
    picked = torch.tensor(slots, dtype=torch.long, device=a.device)
    a_g = a.index_select(1, picked)[:, :, :rank].transpose(0, 1).reshape(len(slots), num_slices * rank, -1)
    b_g = torch.zeros(len(slots), num_slices * rank, b.shape[0], dtype=b.dtype, device=b.device)
    by_slot = b.view(b.shape[0], total_slots, padded).index_select(1, picked)[:, :, :rank]  # [out, S, rank]
    offset = 0
    for i, size in enumerate(output_sizes):
        b_g[:, i * rank : (i + 1) * rank, offset : offset + size] = by_slot[offset : offset + size].permute(
            1, 2, 0)
        offset += size
    return a_g.contiguous(), b_g


def lora_grouped_delta(x: torch.Tensor, out: torch.Tensor, a_g: torch.Tensor, b_g: torch.Tensor,
                       groups: RowGroups) -> torch.Tensor:
    """out += each adapter row's delta, with `grouped_weights`' A and B of `groups.slots`;
    returns out."""
    if groups.index is None:  # one adapter, every row
        h = torch.mm(x.to(a_g.dtype), a_g[0].t())
        out.addmm_(h.to(out.dtype), b_g[0].to(out.dtype))
        return out
    if groups.rows_per_slot == 0:  # one group after another
        for i in range(len(groups.slots)):
            index = groups.index[groups.bounds[i] : groups.bounds[i + 1]]
            h = torch.mm(x.index_select(0, index).to(a_g.dtype), a_g[i].t())
            out.index_add_(0, index, torch.mm(h, b_g[i]).to(out.dtype))
        return out
    xs = x.index_select(0, groups.index).to(a_g.dtype).view(len(groups.slots), groups.rows_per_slot, -1)
    h = torch.bmm(xs, a_g.transpose(1, 2))  # [S, M, n * rank]
    if groups.valid is not None:
        h.mul_(groups.valid)
    delta = torch.bmm(h, b_g)  # [S, M, out]
    out.index_add_(0, groups.index, delta.view(-1, delta.shape[-1]).to(out.dtype))
    return out
