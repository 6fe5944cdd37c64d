"""The grouped LoRA kernels (kernels/triton/lora_grouped.py, under the interpreter) against a
per-row loop, and the step's row tiles (kernels/reference/lora_tiles.py): every adapter row in
exactly one tile of its slot, no tile over the block, the bound a captured graph launches."""

import functools

import numpy as np
import pytest
import torch

from kvdeck.kernels.reference.lora_tiles import (
    TILE_FIELDS,
    RowTiles,
    device_row_tiles,
    max_row_tiles,
    row_tiles,
    tiles_of,
)
from kvdeck.kernels.triton.lora_plan import GROUP_ROWS, LoRAKernelConfig
from tests.kernels.test_lora import _case, _loop


def test_row_tiles_group_each_slots_rows_in_blocks():
    slots = np.array([2, -1, 0, 2, 2, -1, 0, 1, 2])
    packed = row_tiles(slots, block_m=2)
    assert packed.dtype == np.int32 and len(packed) == 4 * TILE_FIELDS + len(slots)
    assert tiles_of(packed, 4) == [(0, [2, 6]), (1, [7]), (2, [0, 3]), (2, [4, 8])]
    # Capacity for a graph: more tiles and rows than the step has; the rest unused.
    padded = row_tiles(slots, block_m=2, num_tiles=7, row_capacity=12)
    assert len(padded) == 7 * TILE_FIELDS + 12 and tiles_of(padded, 7) == tiles_of(packed, 4)
    assert row_tiles(np.array([-1, -1]), 16).tolist() == [0, 0]  # no adapter row: no tile
    with pytest.raises(ValueError, match="need 4 tiles of 2, more than the 3"):
        row_tiles(slots, block_m=2, num_tiles=3)
    with pytest.raises(ValueError, match="9 rows do not fit the tiles' 8"):
        row_tiles(slots, block_m=2, row_capacity=8)


@pytest.mark.parametrize("max_rows, num_slots, block_m", [(64, 8, 16), (7, 3, 2), (5, 4, 16), (33, 2, 16)])
def test_max_row_tiles_bounds_every_mix(max_rows, num_slots, block_m):
    """No mix of up to `max_rows` rows over the slots needs more tiles than the bound, and the
    bound is the most any needs (what a graph launches: tight, not only safe), found here by
    trying every split of the rows over the slots."""
    bound = max_row_tiles(max_rows, num_slots, block_m)

    @functools.cache
    def most(rows: int, slots: int) -> int:  # the most tiles `rows` rows over `slots` slots take
        if slots == 0 or rows == 0:
            return 0
        return max(-(-n // block_m) + most(rows - n, slots - 1) for n in range(rows + 1))

    assert bound == most(max_rows, num_slots)
    rng = np.random.default_rng(0)
    for _ in range(300):
        mix = rng.integers(-1, num_slots, size=rng.integers(1, max_rows + 1))
        packed = row_tiles(mix, block_m, num_tiles=bound, row_capacity=max_rows)
        assert len(tiles_of(packed, bound)) <= bound


def _tiles(token_slots: list[int], block_m: int = GROUP_ROWS) -> RowTiles:
    return device_row_tiles(np.array(token_slots), block_m, torch.device("cpu"))


GROUPED_CONFIGS = [
    LoRAKernelConfig(split_k=0, block_n=16, grouped=True),
    LoRAKernelConfig(split_k=32, block_n=32, grouped=True),
    LoRAKernelConfig(split_k=16, block_n=64, num_warps=2, grouped=True),
    LoRAKernelConfig(split_k=0, block_n=16, fused=True, grouped=True),
    LoRAKernelConfig(split_k=64, block_n=32, fused=True, grouped=True),
]


@pytest.mark.parametrize("config", GROUPED_CONFIGS, ids=lambda c: c.label())
def test_every_grouped_form_matches_a_row_loop(config):
    """Fused slices of unequal sizes, each slot's own rank under the padded one, base rows in
    between, a slot with more rows than one tile (20 of 16), inputs not a whole K step."""
    from kvdeck.kernels.triton.lora_grouped import grouped_linear

    output_sizes, padded = [40, 24, 24], 8
    token_slots = [2, -1, 0] + [1] * 20 + [-1, 2, 0]
    x, out, a, b = _case(3, output_sizes, slots=3, padded=padded, in_size=100, tokens=len(token_slots))
    slot_rank = [8, 3, 5]
    for slot, rank in enumerate(slot_rank):  # zero past each adapter's rank, as the manager keeps it
        a[:, slot, rank:] = 0
        b[:, slot * padded + rank : (slot + 1) * padded] = 0
    expected = _loop(x, out, a, b, token_slots, output_sizes, padded)
    ranks = torch.tensor(slot_rank, dtype=torch.int32)
    got = grouped_linear(x, lambda _: out.clone(), a, b, _tiles(token_slots), ranks, output_sizes, padded,
                         config)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    base = [t for t, s in enumerate(token_slots) if s < 0]
    assert torch.equal(got[base], out[base])


def test_grouped_reads_each_slots_rank_not_its_padding():
    """A slot's weights past its rank (garbage here, zero in the engine) are never read: the
    sums are those of its own rank, at a padded rank over the 16-wide rank block."""
    from kvdeck.kernels.triton.lora_grouped import grouped_linear

    output_sizes, padded = [32], 20
    token_slots = [0, 1, 1, 0, -1]
    x, out, a, b = _case(4, output_sizes, slots=2, padded=padded, in_size=48, tokens=len(token_slots))
    slot_rank = [20, 7]
    clean_a, clean_b = a.clone(), b.clone()
    clean_a[:, 1, 7:] = 0
    clean_b[:, padded + 7 :] = 0
    expected = _loop(x, out, clean_a, clean_b, token_slots, output_sizes, padded)
    for config in (LoRAKernelConfig(split_k=16, grouped=True), LoRAKernelConfig(fused=True, grouped=True)):
        got = grouped_linear(x, lambda _: out.clone(), a, b, _tiles(token_slots, block_m=GROUP_ROWS),
                             torch.tensor(slot_rank, dtype=torch.int32), output_sizes, padded, config)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)


def test_grouped_in_bf16_within_rounding():
    from kvdeck.kernels.triton.lora_grouped import grouped_linear

    output_sizes, padded = [32, 16], 16
    token_slots = [1, 0, -1, 1, 1, 0]
    x, out, a, b = _case(5, output_sizes, slots=2, padded=padded, in_size=64, tokens=len(token_slots))
    a, b = a / 8, b / 4
    expected = _loop(x, out, a, b, token_slots, output_sizes, padded)
    ranks = torch.tensor([16, 16], dtype=torch.int32)
    for config in (LoRAKernelConfig(split_k=32, grouped=True), LoRAKernelConfig(fused=True, grouped=True)):
        got = grouped_linear(x.bfloat16(), lambda _: out.bfloat16(), a.bfloat16(), b.bfloat16(),
                             _tiles(token_slots), ranks, output_sizes, padded, config)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), expected, rtol=3e-2, atol=6e-2)


def test_unused_tiles_write_nothing():
    """A graph's tile buffer holds more tiles than the step uses (count 0): their programs
    return, and a step with no adapter row leaves the output as the base made it."""
    from kvdeck.kernels.triton.lora_grouped import grouped_linear

    output_sizes, padded = [24], 4
    x, out, a, b = _case(6, output_sizes, slots=2, padded=padded, in_size=32, tokens=4)
    ranks = torch.tensor([4, 4], dtype=torch.int32)
    for token_slots in ([-1, -1, -1, -1], [-1, 1, -1, -1]):
        packed = torch.from_numpy(row_tiles(np.array(token_slots), GROUP_ROWS, num_tiles=3, row_capacity=4))
        got = grouped_linear(x, lambda _: out.clone(), a, b, RowTiles.from_packed(packed, 3), ranks,
                             output_sizes, padded, LoRAKernelConfig(split_k=16, grouped=True))
        torch.testing.assert_close(got.double(), _loop(x, out, a, b, token_slots, output_sizes, padded),
                                   rtol=1e-5, atol=1e-4)
    eager = _tiles([-1, -1, -1, -1])  # an eager step's tiles: none, and no launch
    assert eager.tiles.shape == (0, TILE_FIELDS)
    got = grouped_linear(x, lambda _: out.clone(), a, b, eager, ranks, output_sizes, padded,
                         LoRAKernelConfig(grouped=True))
    assert torch.equal(got, out)


def test_grouped_overlap_runs_the_shrink_beside_the_base(monkeypatch):
    """`overlap` with the grouped kernels: the shrink on the side stream after it waits for the
    main one, the base product on the main stream meanwhile, the expand after the join; the
    same sums as one stream (tests/kernels/test_lora.py's fake streams)."""
    from kvdeck.kernels.triton import lora_grouped
    from tests.kernels.test_lora import FakeStreams

    streams = FakeStreams()
    streams.install(monkeypatch, lora_grouped, "grouped_shrink", "grouped_expand")
    log, logged = streams.log, streams.logged
    output_sizes, padded = [40, 24], 8
    token_slots = [2, -1, 0, 1, 2]
    x, out, a, b = _case(8, output_sizes, slots=3, padded=padded, in_size=100, tokens=len(token_slots))
    ranks = torch.tensor([padded] * 3, dtype=torch.int32)
    base = logged("base", lambda inputs: out.clone())
    got = lora_grouped.grouped_linear(x, base, a, b, _tiles(token_slots), ranks, output_sizes, padded,
                                      LoRAKernelConfig(split_k=32, overlap=True, grouped=True))
    assert log == ["side waits for main", "shrink on side", "base on main", "main waits for side",
                   "expand on main"]
    torch.testing.assert_close(got.double(), _loop(x, out, a, b, token_slots, output_sizes, padded),
                               rtol=1e-5, atol=1e-4)
    log.clear()
    one_stream = lora_grouped.grouped_linear(x, base, a, b, _tiles(token_slots), ranks, output_sizes, padded,
                                             LoRAKernelConfig(split_k=32, grouped=True))
    assert log == ["shrink on main", "base on main", "expand on main"]
    assert torch.equal(one_stream, got)
