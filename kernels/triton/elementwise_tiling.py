"""How many rows one program of a row-wise Triton kernel (RMSNorm, RoPE, SiLU, KV write)
takes: enough to fill a tile of a few thousand elements on a GPU, and far more under the
CPU interpreter, whose cost is per program and per op rather than per element."""

import torch
import triton

GPU_TILE_ELEMENTS = 2048
INTERPRETER_TILE_ELEMENTS = 1 << 16


def rows_per_program(num_rows: int, row_elements: int, device: torch.device) -> int:
    """A power of two, at most next_pow2(num_rows); row_elements: the padded row width."""
    budget = GPU_TILE_ELEMENTS if device.type == "cuda" else INTERPRETER_TILE_ELEMENTS
    rows = triton.next_power_of_2(max(1, budget // max(row_elements, 1)))
    if rows * row_elements > budget and rows > 1:
        rows //= 2
    return min(rows, triton.next_power_of_2(max(num_rows, 1)))


def num_warps_for(tile_elements: int) -> int:
    """About 8 elements per thread keeps registers low and loads vectorised."""
    return min(16, max(1, tile_elements // 256))
