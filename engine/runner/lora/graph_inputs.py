"""The adapter decode graphs' inputs (engine/runner/decode_graphs.py): decode-only steps
with adapter rows replay graphs captured with LoRA, as vLLM's punica wrapper does.

A graph fixes its kernels' arguments, so what changes from step to step lives in device
tensors the graph reads: each row's slot (`token_slots`, -1 for base and padding rows, whose
shrink/expand programs return at once), each slot's rank (`LoRAManager.slot_ranks`) and the
slots' weights, all updated in place. The kernels are launched for every row at
max_lora_rank: exact for any adapter, since a slot is zero past its rank, and each row loads
only its own slot's ranks (the rank read from device memory), so one set of graphs serves
every mix of ranks; graphs per rank class would multiply the capture for no less traffic.
Where the device's LoRA kernels are the grouped ones (kernels/triton/lora_grouped.py), the
step's tiles of rows live in a static buffer too (`tiles`), sized for the most tiles any mix
of the largest bucket's rows over the slots needs (kernels/reference/lora_tiles.py): a tile
the step does not use has no rows and its programs return at once.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kvdeck.engine.runner.lora.slots import LoRAContext, LoRAStep
from kvdeck.kernels.reference.lora_tiles import RowTiles, row_tiles


@dataclass(slots=True)
class LoRAGraphInputs:
    context: LoRAContext  # the manager's, read by every layer's slots
    token_slots: torch.Tensor  # int64 [max_batch]: each row's slot, -1 for a base or padding row
    slot_ranks: torch.Tensor  # int32 [max_loras]: each slot's rank (0: empty)
    max_rank: int
    num_slots: int
    backend: str
    tile_rows: int = 0  # the grouped kernels' rows per tile (0: the per-row kernels, no tiles)
    packed_tiles: torch.Tensor | None = None  # int32: lora_tiles.row_tiles' array, max_batch rows
    tiles: RowTiles | None = None  # its views
    num_tiles: int = 0

    def forward(self, model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, meta,
                batch_size: int) -> torch.Tensor:
        """The model's forward with every one of the `batch_size` rows through the adapter
        layers at its `token_slots` slot (captured, or replayed eagerly on CPU)."""
        # A new view each call: the torch reference caches its slot mask by the tensor's identity.
        self.context.step = LoRAStep(None, self.token_slots[:batch_size], self.max_rank, self.num_slots,
                                     self.backend, slot_ranks=self.slot_ranks, tiles=self.tiles)
        try:
            return python_forward(model, input_ids, positions, meta)
        finally:
            self.context.step = None

    def set_rows(self, token_slots: np.ndarray, batch_size: int) -> None:
        """A step's slots (int64, one per row) into the static buffer, its padding rows up to
        `batch_size` at -1; with the grouped kernels, its tiles too (one copy each)."""
        padded = np.full(batch_size, -1, dtype=np.int64)
        padded[: len(token_slots)] = token_slots
        self.token_slots[:batch_size].copy_(torch.from_numpy(padded), non_blocking=True)
        if self.packed_tiles is not None:
            packed = row_tiles(padded, self.tile_rows, self.num_tiles, self.token_slots.shape[0])
            self.packed_tiles.copy_(torch.from_numpy(packed), non_blocking=True)


def python_forward(model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
    """The model's per-layer Python forward: the native CPU decoder stack, which cannot apply
    adapters, unbound for the call."""
    inner = model.model
    stack, inner.decoder_stack = getattr(inner, "decoder_stack", None), None
    try:
        return model(input_ids, positions, meta)
    finally:
        if stack is not None:
            inner.decoder_stack = stack
