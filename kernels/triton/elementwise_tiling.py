"""How many rows one program of a row-wise Triton kernel (RMSNorm, RoPE, SiLU, KV write)
takes: enough to fill a tile of a few thousand elements on a GPU, and far more under the
CPU interpreter, whose cost is per program and per op rather than per element. It depends
on the row width alone, never on how many rows a step has: the count is a constexpr, and a
batch-dependent one would compile a new variant each time a step's size crossed a power of
two (a masked row costs a program nothing)."""

import torch
import triton

GPU_TILE_ELEMENTS = 2048
INTERPRETER_TILE_ELEMENTS = 1 << 16


def rows_per_program(row_elements: int, device: torch.device) -> int:
    """A power of two; row_elements: the padded row width."""
    budget = GPU_TILE_ELEMENTS if device.type == "cuda" else INTERPRETER_TILE_ELEMENTS
    rows = triton.next_power_of_2(max(1, budget // max(row_elements, 1)))
    if rows * row_elements > budget and rows > 1:
        rows //= 2
    return rows


def num_warps_for(tile_elements: int) -> int:
    """About 8 elements per thread keeps registers low and loads vectorised."""
    return min(16, max(1, tile_elements // 256))
