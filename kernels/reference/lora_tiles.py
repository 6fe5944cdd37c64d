"""A step's adapter rows grouped into tiles, for the grouped LoRA kernels
(kernels/triton/lora_grouped.py, the segmented form of vLLM's punica kernels, SGMV).

The per-row kernels (kernels/triton/lora.py, BGMV) give each adapter row its own programs, so
every row reads its adapter's whole A and B: eight rows of one adapter read its weights eight
times. Grouped, each program takes a tile of up to `block_m` rows of one slot and multiplies
them together (tensor-core products), reading the slot's weights once per tile.

The tiles are plain data built on the host from each row's slot (numpy), packed into one
int32 array so a step sends them in one copy (`RowTiles`: its views on the device):
- `num_tiles` rows of TILE_FIELDS: (slot, start, count, 0); a tile's rows are
  sorted[start : start + count]; an unused tile has count 0 (its programs return at once);
- then the sorted rows: every adapter row, grouped by slot (slots ascending, rows ascending
  within a slot), padded with zeros to the array's row capacity.
A base row (slot -1) is in no tile. A decode graph captures the kernels over `max_row_tiles`
tiles, enough for any mix of its rows and slots.
"""

from dataclasses import dataclass

import numpy as np
import torch

TILE_FIELDS = 4  # slot, start, count, and a zero: 16-byte tile rows


@dataclass(slots=True)
class RowTiles:
    """A step's tiles on the device: views of one packed int32 buffer (`row_tiles`)."""

    tiles: torch.Tensor  # int32 [num_tiles, TILE_FIELDS]: slot, start, count, 0
    rows: torch.Tensor  # int32 [capacity]: the adapter rows, grouped by slot

    @classmethod
    def from_packed(cls, packed: torch.Tensor, num_tiles: int) -> "RowTiles":
        split = num_tiles * TILE_FIELDS
        return cls(packed[:split].view(num_tiles, TILE_FIELDS), packed[split:])


def device_row_tiles(token_slots: np.ndarray, block_m: int, device: torch.device) -> RowTiles:
    """An eager step's tiles (as many as its rows need) on `device`, in one copy."""
    packed = row_tiles(token_slots, block_m)
    num_tiles = (len(packed) - len(token_slots)) // TILE_FIELDS
    return RowTiles.from_packed(torch.from_numpy(packed).to(device, non_blocking=True), num_tiles)


def max_row_tiles(max_rows: int, num_slots: int, block_m: int) -> int:
    """The most tiles `max_rows` rows over `num_slots` slots can need: the k slots with rows
    (k <= both) take sum(ceil(n_s / block_m)) <= (max_rows + k * (block_m - 1)) / block_m."""
    used = min(num_slots, max_rows)
    return max(1, (max_rows + used * (block_m - 1)) // block_m)


def row_tiles(token_slots: np.ndarray, block_m: int, num_tiles: int | None = None,
              row_capacity: int | None = None) -> np.ndarray:
    """int32 [num_tiles * TILE_FIELDS + row_capacity]: the tiles of `token_slots` (each row's
    slot, -1: no adapter), then the rows they index (module docstring). `num_tiles` None: as
    many as the rows need; `row_capacity` None: len(token_slots)."""
    token_slots = np.asarray(token_slots, dtype=np.int64)
    row_capacity = len(token_slots) if row_capacity is None else row_capacity
    if len(token_slots) > row_capacity:
        raise ValueError(f"{len(token_slots)} rows do not fit the tiles' {row_capacity}")
    adapter_rows = np.flatnonzero(token_slots >= 0)
    sorted_rows = adapter_rows[np.argsort(token_slots[adapter_rows], kind="stable")]
    slots, first, counts = np.unique(token_slots[sorted_rows], return_index=True, return_counts=True)
    tiles = [(slot, start + offset, min(block_m, count - offset))
             for slot, start, count in zip(slots.tolist(), first.tolist(), counts.tolist())
             for offset in range(0, count, block_m)]
    num_tiles = len(tiles) if num_tiles is None else num_tiles
    if len(tiles) > num_tiles:
        raise ValueError(f"the step's adapter rows need {len(tiles)} tiles of {block_m}, "
                         f"more than the {num_tiles} its kernels were launched for")
    packed = np.zeros(num_tiles * TILE_FIELDS + row_capacity, dtype=np.int32)
    if tiles:
        packed[: len(tiles) * TILE_FIELDS].reshape(len(tiles), TILE_FIELDS)[:, :3] = tiles
    packed[num_tiles * TILE_FIELDS : num_tiles * TILE_FIELDS + len(sorted_rows)] = sorted_rows
    return packed


def tiles_of(packed: np.ndarray, num_tiles: int) -> list[tuple[int, list[int]]]:
    """(slot, rows) of each used tile of a packed array (for tests and reading a step)."""
    fields = packed[: num_tiles * TILE_FIELDS].reshape(num_tiles, TILE_FIELDS)
    rows = packed[num_tiles * TILE_FIELDS :]
    return [(int(slot), rows[start : start + count].tolist())
            for slot, start, count, _ in fields if count > 0]
