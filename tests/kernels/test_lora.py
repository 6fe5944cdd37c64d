"""LoRA shrink/expand: the torch reference against a per-row loop of plain matmuls, and the
Triton pair (under the interpreter) against the reference: fused slices of unequal sizes,
ranks below the padded one, base rows skipped, rows in any order."""

import contextlib

import numpy as np
import pytest
import torch

from kvdeck.kernels.reference.lora import lora_linear_delta
from kvdeck.kernels.reference.lora_grouped import group_rows, grouped_weights, lora_grouped_delta
from kvdeck.kernels.triton.lora import lora_linear_delta_triton
from kvdeck.kernels.triton.lora_plan import LoRAKernelConfig


def _case(seed: int, output_sizes: list[int], dtype=torch.float32, slots: int = 3, padded: int = 8,
          in_size: int = 48, tokens: int = 7):
    gen = torch.Generator().manual_seed(seed)
    n = len(output_sizes)
    a = torch.randn(n, slots, padded, in_size, generator=gen).to(dtype)
    b = torch.randn(sum(output_sizes), slots * padded, generator=gen).to(dtype)
    x = torch.randn(tokens, in_size, generator=gen).to(dtype)
    out = torch.randn(tokens, sum(output_sizes), generator=gen).to(dtype)
    return x, out, a, b


def _loop(x, out, a, b, token_slots: list[int], output_sizes: list[int], rank: int) -> torch.Tensor:
    """Row by row: out[t, slice i] += B_i[:rank] @ (A_i[:rank] @ x[t]) for rows with a slot."""
    expected = out.clone().double()
    padded = a.shape[2]
    for t, slot in enumerate(token_slots):
        if slot < 0:
            continue
        offset = 0
        for i, size in enumerate(output_sizes):
            h = a[i, slot, :rank].double() @ x[t].double()
            columns = slice(slot * padded, slot * padded + rank)
            expected[t, offset : offset + size] += b[offset : offset + size, columns].double() @ h
            offset += size
    return expected


@pytest.mark.parametrize("output_sizes, rank", [([40], 8), ([32, 16, 16], 5), ([24, 24], 8)])
@pytest.mark.parametrize("every_row", [False, True])
def test_reference_and_triton_match_a_row_loop(output_sizes, rank, every_row):
    x, out, a, b = _case(0, output_sizes, slots=4)  # the rows use slots 0-2 of 4
    token_slots = [1, 0, 2, 1, 0, 2, 1] if every_row else [1, -1, 2, -1, 0, 1, -1]
    rows = [t for t, s in enumerate(token_slots) if s >= 0]
    rows_t = None if every_row else torch.tensor(rows)
    row_slots = torch.tensor([token_slots[t] for t in rows])
    expected = _loop(x, out, a, b, token_slots, output_sizes, rank)
    reference = lora_linear_delta(x, out.clone(), a, b, rows_t, row_slots, output_sizes, rank)
    torch.testing.assert_close(reference.double(), expected, rtol=1e-5, atol=1e-4)
    # Computing only the slots the step uses gives the same sums.
    fewer = lora_linear_delta(x, out.clone(), a, b, rows_t, row_slots, output_sizes, rank, num_slots=3)
    torch.testing.assert_close(fewer, reference)
    triton_out = lora_linear_delta_triton(x, out.clone(), a, b, rows_t, row_slots, output_sizes, rank)
    torch.testing.assert_close(triton_out, reference, rtol=1e-5, atol=1e-4)
    base_rows = [t for t, s in enumerate(token_slots) if s < 0]
    assert torch.equal(triton_out[base_rows], out[base_rows])  # base rows untouched


def test_reference_masks_base_rows_given_every_row():
    output_sizes, rank = [32, 16, 16], 6
    x, out, a, b = _case(3, output_sizes)
    token_slots = [2, -1, 0, 1, -1, 2, 0]
    expected = _loop(x, out, a, b, token_slots, output_sizes, rank)
    got = lora_linear_delta(x, out.clone(), a, b, None, torch.tensor(token_slots), output_sizes, rank)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)


def test_triton_in_bf16_within_rounding():
    output_sizes, rank = [32, 16, 16], 8
    x, out, a, b = _case(1, output_sizes, dtype=torch.bfloat16)
    rows, row_slots = torch.tensor([0, 2, 5]), torch.tensor([2, 0, 1])
    reference = lora_linear_delta(x.float(), out.float(), a.float(), b.float(), rows, row_slots,
                                  output_sizes, rank)
    got = lora_linear_delta_triton(x, out.clone(), a, b, rows, row_slots, output_sizes, rank)
    torch.testing.assert_close(got.float(), reference, rtol=2e-2, atol=0.25)


def test_no_adapter_rows_changes_nothing():
    x, out, a, b = _case(2, [16])
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(lora_linear_delta_triton(x, out.clone(), a, b, empty, empty, [16], 4), out)
    assert torch.equal(lora_linear_delta(x, out.clone(), a, b, empty, empty, [16], 4), out)


@pytest.mark.parametrize("token_slots", [
    [1, 0, 2, 1, 0, 2, 1],  # every row, equal groups: one padded batch
    [1, -1, 2, -1, 0, 1, -1],  # base rows skipped, padding zeroed
    [2, 2, 2, 2, 2, 0, -1],  # unequal groups: one after another
    [1, 1, 1, 1, 1, 1, 1],  # one adapter on every row: no gather
])
@pytest.mark.parametrize("output_sizes, rank", [([40], 8), ([32, 16, 16], 5)])
def test_grouped_cpu_path_matches_a_row_loop(token_slots, output_sizes, rank):
    x, out, a, b = _case(4, output_sizes, slots=4)
    groups = group_rows(np.asarray(token_slots), torch.float32, torch.device("cpu"))
    a_g, b_g = grouped_weights(a, b, output_sizes, rank, groups.slots)
    got = lora_grouped_delta(x, out.clone(), a_g, b_g, groups)
    torch.testing.assert_close(got.double(), _loop(x, out, a, b, token_slots, output_sizes, rank),
                               rtol=1e-5, atol=1e-4)


def test_grouped_rows_padding_and_modes():
    cpu = torch.device("cpu")
    assert group_rows(np.asarray([-1, -1]), torch.float32, cpu) is None
    padded = group_rows(np.asarray([3, 0, -1, 3, 0, 3]), torch.float32, cpu)
    assert padded.slots == (0, 3) and padded.rows_per_slot == 3
    assert padded.index.tolist() == [1, 4, 1, 0, 3, 5]
    assert padded.valid.flatten().tolist() == [1, 1, 0, 1, 1, 1]
    apart = group_rows(np.asarray([0] * 9 + [1]), torch.float32, cpu)
    assert apart.rows_per_slot == 0 and apart.bounds == (0, 9, 10)
    assert group_rows(np.asarray([2, 2, 2]), torch.float32, cpu).index is None


def test_triton_every_row_skips_negative_slots_and_reads_slot_ranks():
    """The decode graphs' form: every row given (padding and base rows at slot -1, which must
    write nothing and read no slot), launched at the padded rank with each slot's own rank
    from device memory. Slots are zero past their rank, so the sums equal the reference's."""
    output_sizes, padded = [32, 16, 16], 8
    x, out, a, b = _case(5, output_sizes, slots=3, padded=padded)
    slot_rank = [8, 3, 5]
    for slot, rank in enumerate(slot_rank):  # the manager's layout: zero past the adapter's rank
        a[:, slot, rank:] = 0
        b[:, slot * padded + rank : (slot + 1) * padded] = 0
    token_slots = [2, -1, 0, -1, 1, 2, -1]
    row_slots = torch.tensor(token_slots)
    expected = _loop(x, out, a, b, token_slots, output_sizes, padded)
    got = lora_linear_delta_triton(x, out.clone(), a, b, None, row_slots, output_sizes, padded,
                                   torch.tensor(slot_rank, dtype=torch.int32))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    base = [t for t, s in enumerate(token_slots) if s < 0]
    assert torch.equal(got[base], out[base])  # bit for bit: never read nor written
    # A slot rank below the weights' shows it is read: slot 0 then adds only its first 2 ranks.
    short = lora_linear_delta_triton(x, out.clone(), a, b, None, row_slots, output_sizes, padded,
                                     torch.tensor([2, 3, 5], dtype=torch.int32))
    a2, b2 = a.clone(), b.clone()
    a2[:, 0, 2:] = 0
    torch.testing.assert_close(short.double(), _loop(x, out, a2, b2, token_slots, output_sizes, padded),
                               rtol=1e-5, atol=1e-4)
    # Every row at slot -1: the output is untouched.
    none = torch.full((7,), -1)
    assert torch.equal(lora_linear_delta_triton(x, out.clone(), a, b, None, none, output_sizes, padded), out)


def test_a_large_rank_reads_narrower_k_tiles_with_the_same_sums():
    # Rank 40 pads to a 64-rank block, whose shrink reads 32 input columns at a time
    # (shrink_block_k): 100 inputs take four K tiles, the last one partly masked.
    from kvdeck.kernels.triton.lora import shrink_block_k

    assert shrink_block_k(64) == 32 and shrink_block_k(16) == 64 and shrink_block_k(256) == 16
    assert shrink_block_k(16, 256) == 256 and shrink_block_k(64, 256) == 256 and shrink_block_k(16, 32) == 32
    assert shrink_block_k(256, 512) == 64  # a chunk of 512 at rank 256: eight 64-wide tiles
    output_sizes, rank = [24, 40], 40
    x, out, a, b = _case(5, output_sizes, slots=2, padded=48, in_size=100, tokens=4)
    token_slots = [1, -1, 0, 1]
    rows = torch.tensor([t for t, s in enumerate(token_slots) if s >= 0])
    row_slots = torch.tensor([s for s in token_slots if s >= 0])
    expected = _loop(x, out, a, b, token_slots, output_sizes, rank)
    got = lora_linear_delta_triton(x, out.clone(), a, b, rows, row_slots, output_sizes, rank)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-3)
    assert torch.equal(got[1], out[1])


def test_a_chunk_wider_than_a_tile_sums_its_tiles():
    # Rank 100 pads to a 128-rank block, whose chunk of 256 inputs is two 128-wide tiles
    # (shrink_block_k); 300 inputs leave a ragged second chunk.
    from kvdeck.kernels.triton.lora import shrink_block_k

    assert shrink_block_k(128, 256) == 128
    output_sizes, rank = [24], 100
    x, out, a, b = _case(8, output_sizes, slots=2, padded=rank, in_size=300, tokens=3)
    token_slots = [1, 0, -1]
    rows, row_slots = torch.tensor([0, 1]), torch.tensor([1, 0])
    expected = _loop(x, out, a, b, token_slots, output_sizes, rank)
    got = lora_linear_delta_triton(x, out.clone(), a, b, rows, row_slots, output_sizes, rank,
                                   config=LoRAKernelConfig(split_k=256))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-3)
    assert torch.equal(got[2], out[2])


# Launch configs (kernels/triton/lora_plan.py): K split into chunks whose partial sums the
# expand adds (a ragged last chunk), one program walking all of K, both halves fused in one
# launch, narrow and wide output blocks: the same sums in every form.
LAUNCH_CONFIGS = [
    LoRAKernelConfig(split_k=0, block_n=16),
    LoRAKernelConfig(split_k=16, block_n=32),
    LoRAKernelConfig(split_k=32, block_n=128),
    LoRAKernelConfig(split_k=256, block_n=64, num_warps=2),
    LoRAKernelConfig(split_k=0, block_n=16, fused=True),
    LoRAKernelConfig(split_k=64, block_n=128, fused=True),
]


@pytest.mark.parametrize("config", LAUNCH_CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("form", ["rows", "every_row_with_ranks"])
def test_every_launch_config_gives_the_same_sums(config, form):
    output_sizes, padded = [40, 24, 24], 8
    x, out, a, b = _case(6, output_sizes, slots=3, padded=padded, in_size=100, tokens=6)
    slot_rank = [8, 3, 5]
    for slot, rank in enumerate(slot_rank):  # zero past each adapter's rank, as the manager keeps it
        a[:, slot, rank:] = 0
        b[:, slot * padded + rank : (slot + 1) * padded] = 0
    token_slots = [2, -1, 0, 1, -1, 2]
    expected = _loop(x, out, a, b, token_slots, output_sizes, padded)
    if form == "rows":
        rows = torch.tensor([t for t, s in enumerate(token_slots) if s >= 0])
        row_slots = torch.tensor([s for s in token_slots if s >= 0])
        got = lora_linear_delta_triton(x, out.clone(), a, b, rows, row_slots, output_sizes, padded,
                                       config=config)
    else:
        got = lora_linear_delta_triton(x, out.clone(), a, b, None, torch.tensor(token_slots), output_sizes,
                                       padded, torch.tensor(slot_rank, dtype=torch.int32), config=config)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    base = [t for t, s in enumerate(token_slots) if s < 0]
    assert torch.equal(got[base], out[base])


def test_split_shrink_writes_one_partial_per_chunk():
    from kvdeck.kernels.triton.lora import lora_shrink_triton

    output_sizes, rank = [16, 16], 4
    x, _, a, _ = _case(7, output_sizes, slots=2, padded=rank, in_size=100, tokens=3)
    row_slots = torch.tensor([1, 0, 1])
    config = LoRAKernelConfig(split_k=32)
    h = lora_shrink_triton(x, a, None, row_slots, 2, rank, config=config)
    assert h.shape == (3, 4, 2 * rank) and config.num_splits(100) == 4  # 32 + 32 + 32 + 4 columns
    for j, slot in enumerate(row_slots.tolist()):
        for piece in range(2):
            chunks = [a[piece, slot, :, k : k + 32] @ x[j, k : k + 32] for k in range(0, 100, 32)]
            torch.testing.assert_close(h[j, :, piece * rank : (piece + 1) * rank], torch.stack(chunks),
                                       rtol=1e-5, atol=1e-5)


def test_launch_config_parsing_and_the_env_override(monkeypatch):
    from kvdeck.kernels.triton import lora_plan

    assert lora_plan.parse_config("split_k=64, fused=1") == LoRAKernelConfig(split_k=64, fused=True)
    label = "split_k=64,block_n=128,fused=0,num_warps=4,overlap=0,grouped=0"
    assert LoRAKernelConfig(split_k=64).label() == label
    assert lora_plan.parse_config("grouped=1,fused=1") == LoRAKernelConfig(fused=True, grouped=True)
    assert lora_plan.parse_config("overlap=1") == LoRAKernelConfig(overlap=True)
    assert lora_plan.parse_config(LoRAKernelConfig(split_k=0, block_n=32).label()) == LoRAKernelConfig(0, 32)
    for bad, says in [("split=64", "not one of"), ("block_n=x", "must be an integer"),
                      ("block_n=48", "power of two"), ("split_k=8", "too small"),
                      ("num_warps=0", "power of two"), ("fused=1,overlap=1", "two-launch form")]:
        with pytest.raises(ValueError, match=says):
            lora_plan.parse_config(bad)
    assert LoRAKernelConfig(split_k=256).num_splits(3072) == 12
    assert LoRAKernelConfig(split_k=0).num_splits(3072) == LoRAKernelConfig(fused=True).num_splits(3072) == 1
    monkeypatch.setattr(lora_plan, "_CHOSEN", {})
    monkeypatch.setitem(lora_plan.TUNED, 90, {"config": {"split_k": 128, "block_n": 64, "fused": False,
                                                         "num_warps": 4}, "source": "test"})
    assert lora_plan.lora_kernel_config(90) == LoRAKernelConfig(split_k=128, block_n=64)
    assert lora_plan.lora_kernel_config(None) == lora_plan.DEFAULT_CONFIG  # off CUDA: the defaults
    monkeypatch.setattr(lora_plan, "_CHOSEN", {})
    monkeypatch.setenv("KVDECK_LORA_KERNEL", "fused=1")
    assert lora_plan.lora_kernel_config(90) == LoRAKernelConfig(split_k=128, block_n=64, fused=True)


class _FakeStream:
    def __init__(self, name: str, streams: "FakeStreams") -> None:
        self.name, self.streams = name, streams

    def wait_stream(self, other: "_FakeStream") -> None:
        self.streams.log.append(f"{self.name} waits for {other.name}")


class FakeStreams:
    """A main and a side stream that record what the overlapped launch asks of them (the CPU
    has none), and the launches logged with the stream they ran on."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = "main"
        self.main, self.side = _FakeStream("main", self), _FakeStream("side", self)

    def install(self, monkeypatch, module, shrink: str, expand: str) -> None:
        """`module`'s streams faked, its `shrink` and `expand` launches logged."""
        monkeypatch.setattr(module, "overlap_streams",
                            lambda x, config: (self.main, self.side) if config.overlap else None)
        monkeypatch.setattr(module, "stream_context", self.on_stream)
        monkeypatch.setattr(module, shrink, self.logged("shrink", getattr(module, shrink)))
        monkeypatch.setattr(module, expand, self.logged("expand", getattr(module, expand)))

    @contextlib.contextmanager
    def on_stream(self, stream: _FakeStream):
        before, self.current = self.current, stream.name
        try:
            yield
        finally:
            self.current = before

    def logged(self, name: str, fn):
        def run(*args, **kwargs):
            self.log.append(f"{name} on {self.current}")
            return fn(*args, **kwargs)
        return run


def test_overlap_runs_the_shrink_beside_the_base_and_joins_before_the_expand(monkeypatch):
    """Under `overlap` the shrink is launched on the side stream after it waits for the main
    one (x written), the base product on the main stream meanwhile, and the expand only after
    the main stream waits for the side: the same sums as one stream."""
    from kvdeck.kernels.triton import lora

    streams = FakeStreams()
    streams.install(monkeypatch, lora, "lora_shrink_triton", "lora_expand_triton")
    log, logged = streams.log, streams.logged
    output_sizes, padded = [40, 24], 8
    x, out, a, b = _case(8, output_sizes, slots=3, padded=padded, in_size=100, tokens=5)
    token_slots = [2, -1, 0, 1, 2]
    expected = _loop(x, out, a, b, token_slots, output_sizes, padded)
    base = logged("base", lambda inputs: out.clone())
    config = LoRAKernelConfig(split_k=32, overlap=True)
    got = lora.lora_linear_triton(x, base, a, b, None, torch.tensor(token_slots), output_sizes, padded,
                                  config=config)
    assert log == ["side waits for main", "shrink on side", "base on main", "main waits for side",
                   "expand on main"]
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)
    log.clear()
    one_stream = lora.lora_linear_triton(x, base, a, b, None, torch.tensor(token_slots), output_sizes,
                                         padded, config=LoRAKernelConfig(split_k=32))
    assert log == ["base on main", "shrink on main", "expand on main"]
    assert torch.equal(one_stream, got)
