"""The device slots of one linear layer: every loaded adapter's A and B for its fused slices,
in tensors of fixed shape, and the step's delta added to the layer's output.

`Linear.forward` calls `apply(x, base)` when the layer has slots (`Linear.lora`), `base` its
own product without adapters (the Triton pair may run its shrink beside it). The step (which
rows use which slot) is the manager's `LoRAContext`, shared by every layer; outside a step
with adapter rows it is None and the layer costs one attribute read and a call. On the torch path
the step's rows come grouped by adapter (kernels/reference/lora_grouped.py) and each layer
keeps its slots in that layout too, rebuilt only when a slot is loaded or the step's
adapters or rank change.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvdeck.kernels.dispatch import lora_linear
from kvdeck.kernels.reference.lora_grouped import RowGroups, grouped_weights, lora_grouped_delta
from kvdeck.kernels.reference.lora_tiles import RowTiles


@dataclass(slots=True)
class LoRAStep:
    """Which rows of this step's tokens use an adapter, and its slot."""

    rows: torch.Tensor | None  # int64 [L]: the token rows with an adapter (None: every row)
    row_slots: torch.Tensor | None  # int64 [L]: each one's slot (None on the torch path)
    rank: int  # the largest rank among the step's adapters
    num_slots: int  # the step's adapters sit in slots [0, num_slots)
    backend: str  # the kernels' backend (auto | triton | torch)
    groups: RowGroups | None = None  # the torch path: rows grouped by slot (rows/row_slots unused)
    slot_ranks: torch.Tensor | None = None  # int32 [slots]: each slot's rank (the decode graphs')
    tiles: RowTiles | None = None  # the grouped Triton kernels' tiles of rows (then rows/row_slots unused)


@dataclass(slots=True)
class LoRAContext:
    step: LoRAStep | None = None


class LinearSlots:
    """A [n, slots, R, in] and B [out, slots * R] (R: max_lora_rank) of one fused linear
    (the layout of kernels/reference/lora.py)."""

    __slots__ = ("context", "output_sizes", "offsets", "max_rank", "a", "b", "_grouped", "_grouped_key")

    def __init__(self, context: LoRAContext, num_slots: int, max_rank: int, in_size: int,
                 output_sizes: list[int], dtype: torch.dtype, device: torch.device) -> None:
        self.context = context
        self.output_sizes = list(output_sizes)
        self.offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]
        self.max_rank = max_rank
        self.a = torch.zeros(len(output_sizes), num_slots, max_rank, in_size, dtype=dtype, device=device)
        self.b = torch.zeros(sum(output_sizes), num_slots * max_rank, dtype=dtype, device=device)
        self._grouped: tuple[torch.Tensor, torch.Tensor] | None = None  # the torch path's layout
        self._grouped_key: tuple[int, tuple[int, ...]] | None = None  # ... of (rank, slots)

    def clear(self, slot: int) -> None:
        self._grouped_key = None
        self.a[:, slot].zero_()
        self.b[:, slot * self.max_rank : (slot + 1) * self.max_rank].zero_()

    def load(self, slot: int, index: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Slice `index`'s A [r, in] and B [out_index, r] into `slot` (the rest stays zero)."""
        self._grouped_key = None
        rank = a.shape[0]
        self.a[index, slot, :rank].copy_(a, non_blocking=True)
        offset = self.offsets[index]
        column = slot * self.max_rank
        self.b[offset : offset + self.output_sizes[index], column : column + rank].copy_(b, non_blocking=True)

    def apply(self, x: torch.Tensor, base: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """base(x) plus the step's adapter rows' deltas (the kernels may run part of them
        beside `base`: kernels/dispatch.lora_linear)."""
        step = self.context.step
        if step is None:
            return base(x)
        if step.groups is not None:
            key = (step.rank, step.groups.slots)
            if key != self._grouped_key:
                self._grouped = grouped_weights(self.a, self.b, self.output_sizes, *key)
                self._grouped_key = key
            return lora_grouped_delta(x, base(x), *self._grouped, step.groups)
        return lora_linear(x, base, self.a, self.b, step.rows, step.row_slots, self.output_sizes,
                           step.rank, step.num_slots, step.backend, step.slot_ranks, step.tiles)
