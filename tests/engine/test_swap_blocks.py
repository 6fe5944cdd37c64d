"""Swap preemption's bookkeeping (engine/core/swap.py) under random add/step/abort
interleavings, against a simulated KV pool: every block and host slot holds what was written
into it, copies run in the runner's order (engine/runner/kv_swap.py) before each step's
"forward" writes, and every scheduled request must find its own K/V in its blocks. So a
block released by a swap-out and reused in the same step, a shared prefix block, a host
slot given back and taken again, and an abort mid-swap are all checked by content."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.host_block_pool import HostBlockPool
from kvdeck.engine.core.request import NO_BLOCK, Request, RequestStatus
from kvdeck.engine.core.scheduler import ScheduledBatch, Scheduler
from kvdeck.engine.core.swap import SwapSpace
from kvdeck.engine.types.sampling_params import SamplingParams
from tests.engine.test_block_manager import _check_invariants

BLOCK = 4


class SimulatedPool:
    """Block contents: per block, per offset, the hash of the tokens up to that position."""

    def __init__(self, num_blocks: int, num_slots: int) -> None:
        self.device = [[None] * BLOCK for _ in range(num_blocks)]
        self.host = [[None] * BLOCK for _ in range(num_slots)]

    def copy(self, batch: ScheduledBatch) -> None:
        gathered = [list(self.device[b]) for b, _ in batch.blocks_to_swap_out]
        incoming = [list(self.host[s]) for s, _ in batch.blocks_to_swap_in]
        for (_, slot), rows in zip(batch.blocks_to_swap_out, gathered):
            self.host[slot] = rows
        for (_, block), rows in zip(batch.blocks_to_swap_in, incoming):
            self.device[block] = rows

    def check_reads(self, request: Request, windows: list[int | None]) -> None:
        """What the request's attention reads (positions before num_computed_tokens) is its own."""
        for window, table in zip(windows, request.block_tables):
            start = 0 if window is None else max(0, request.num_computed_tokens - window + 1)
            for p in range(start, request.num_computed_tokens):
                block = table[p // BLOCK]
                assert block != NO_BLOCK
                assert self.device[block][p % BLOCK] == _content(request, p), \
                    f"request {request.request_id} reads someone else's K/V at {p}"

    def write(self, request: Request, num_tokens: int) -> None:
        for p in range(request.num_computed_tokens, min(request.num_computed_tokens + num_tokens,
                                                        request.num_tokens)):
            for table in request.block_tables:
                if table[p // BLOCK] != NO_BLOCK:
                    self.device[table[p // BLOCK]][p % BLOCK] = _content(request, p)


def _content(request: Request, position: int) -> int:
    return hash((request.long_rope, tuple(request.token_ids_between(0, position + 1))))


def _check_swap(sched: Scheduler, swap: SwapSpace) -> None:
    slots = Counter(s for record in swap.swapped.values() for s in record.slots)
    assert all(n == 1 for n in slots.values()), "a host slot holds two blocks"
    assert swap.host.num_used == len(slots), "a host slot leaked"
    swapped = {r.request_id for r in sched.waiting if r.status is RequestStatus.SWAPPED}
    assert swapped == set(swap.swapped), "swapped requests and swap records differ"
    for r in sched.running:
        assert r.request_id not in swap.swapped


step_op = st.tuples(st.just("step"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0))
operation = st.one_of(  # steps weighted up, so that requests grow into each other's blocks
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 24), st.integers(0, 3)),
    step_op, step_op, step_op,
    st.tuples(st.just("abort"), st.integers(0, 40), st.integers(0, 0), st.integers(0, 0)),
)


@settings(max_examples=120, deadline=None)
@given(
    ops=st.lists(operation, min_size=12, max_size=80),
    num_blocks=st.integers(6, 14),
    num_slots=st.sampled_from([2, 8, 64]),
    budget=st.integers(3, 40),
    caching=st.booleans(),
    windows=st.sampled_from([(None,), (6,), (None, 5, 5)]),
    mode=st.sampled_from(["swap", "auto"]),
)
def test_swapped_requests_find_their_kv_and_nothing_leaks(ops, num_blocks, num_slots, budget, caching,
                                                          windows, mode):
    bm = BlockManager(num_blocks * len(windows), BLOCK, caching, windows)
    swap = SwapSpace(bm, HostBlockPool(num_slots), mode, block_bytes=1, min_tokens=6)
    max_len = num_blocks * BLOCK
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=budget, max_model_len=max_len, swap=swap)
    pool = SimulatedPool(bm.num_blocks, num_slots)
    next_id = token = 0

    def step() -> None:
        nonlocal token
        batch = sched.schedule()
        _check_invariants(bm, sched)
        _check_swap(sched, swap)
        pool.copy(batch)
        sampled = []
        for request, n in zip(batch.requests, batch.num_new_tokens):
            pool.check_reads(request, list(windows))
            pool.write(request, n)
            done = request.num_computed_tokens + n == request.num_tokens
            sampled.append(token % 11 if done else None)
            token += 1
        sched.update_from_output(batch, sampled)

    for kind, a, b, c in ops:
        if kind == "add":
            prompt = [(c * 7 + i) % 11 for i in range(min(a, max_len - 1))]  # shared prefixes
            sched.add_request(Request(str(next_id), prompt, SamplingParams(max_tokens=b, ignore_eos=True),
                                      eos_token_ids=set()))
            next_id += 1
        elif kind == "step":
            step()
        else:  # wherever it is: running, waiting, swapped out
            sched.finish_requests({str(a)}, RequestStatus.FINISHED_ABORTED)
        _check_invariants(bm, sched)
        _check_swap(sched, swap)
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        step()
        _check_swap(sched, swap)
    assert not sched.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_blocks and swap.host.num_used == 0


def _request(request_id: str, prompt: list[int], max_tokens: int = 20) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), set())


def _run(sched: Scheduler, steps: int) -> list[ScheduledBatch]:
    batches = []
    for _ in range(steps):
        batch = sched.schedule()
        sched.update_from_output(batch, [1 if r.num_computed_tokens + n == r.num_tokens else None
                                         for r, n in zip(batch.requests, batch.num_new_tokens)])
        batches.append(batch)
    return batches


def test_a_victims_blocks_are_copied_out_in_the_step_that_reuses_them():
    bm = BlockManager(6, BLOCK, enable_prefix_caching=False)
    swap = SwapSpace(bm, HostBlockPool(8), "swap", block_bytes=100)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=24, swap=swap)
    old, new = _request("old", list(range(11))), _request("new", list(range(20, 31)))
    sched.add_request(old)
    sched.add_request(new)
    _run(sched, 1)  # both prefilled: 3 blocks each, the pool is full
    held_by_new = list(new.block_table)
    batch = _run(sched, 2)[-1]  # old grows into a 4th block: new is swapped out for it
    assert new.status is RequestStatus.SWAPPED and new.num_computed_tokens == 12
    assert [b for b, _ in batch.blocks_to_swap_out] == held_by_new
    assert set(old.block_table) & set(held_by_new), "the freed block went to old in that step"
    assert swap.host.num_used == 3 and not new.block_tables
    assert new.timeline.swaps[-1][:2] == (batch.step, 300)
    slots = list(swap.swapped["new"].slots)
    sched.finish_requests({"old"}, RequestStatus.FINISHED_ABORTED)
    batch = _run(sched, 1)[0]  # new comes back: decodes on, nothing recomputed
    assert new.status is RequestStatus.RUNNING and batch.num_new_tokens == [1]
    assert [s for s, _ in batch.blocks_to_swap_in] == slots
    assert [b for _, b in batch.blocks_to_swap_in] == new.block_table[:3]
    assert swap.host.num_used == 0 and swap.counters.swap_ins == 1


def test_shared_prefix_blocks_stay_with_their_other_holders():
    bm = BlockManager(8, BLOCK, enable_prefix_caching=True)
    swap = SwapSpace(bm, HostBlockPool(16), "swap", block_bytes=1)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, swap=swap)
    prefix = list(range(8))  # two full blocks both requests share
    first, second = _request("a", prefix + [50, 51, 52]), _request("b", prefix + [60, 61, 62])
    sched.add_request(first)
    _run(sched, 1)
    sched.add_request(second)
    _run(sched, 1)
    shared = second.block_table[:2]
    assert shared == first.block_table[:2] and all(bm.blocks[b].ref_count == 2 for b in shared)
    batch = ScheduledBatch(step=99)
    sched._preempt(second, batch, "a")
    assert second.status is RequestStatus.SWAPPED
    assert [b for b, _ in batch.blocks_to_swap_out][:2] == shared  # copied too
    assert all(bm.blocks[b].ref_count == 1 for b in shared)  # only b's references went
    assert first.block_table[:2] == shared
    _check_invariants(bm, sched)


def test_auto_recomputes_short_victims_and_when_the_space_is_full():
    bm = BlockManager(8, BLOCK, enable_prefix_caching=False)
    swap = SwapSpace(bm, HostBlockPool(2), "auto", block_bytes=1, min_tokens=8)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, swap=swap)
    short, long_ = _request("s", [1, 2, 3]), _request("l", list(range(12)))
    for r in (short, long_):
        sched.add_request(r)
    _run(sched, 1)
    sched._preempt(short, ScheduledBatch(), "x")  # 3 tokens < 8: recompute
    assert short.status is RequestStatus.PREEMPTED and short.num_computed_tokens == 0
    sched._preempt(long_, ScheduledBatch(), "x")  # 12 tokens, 3 blocks > 2 free slots
    assert long_.status is RequestStatus.PREEMPTED and swap.host.num_used == 0
    assert swap.counters.recomputed == 2


def test_an_empty_batch_never_leaves_a_swap_out_uncopied():
    bm = BlockManager(4, BLOCK, enable_prefix_caching=False)
    swap = SwapSpace(bm, HostBlockPool(8), "swap", block_bytes=1)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16, swap=swap)
    lone = _request("lone", list(range(6)))
    sched.add_request(lone)
    _run(sched, 1)
    batch = ScheduledBatch(step=5)
    sched._preempt(lone, batch, "")
    assert lone.status is RequestStatus.SWAPPED
    swap.cancel_swap_outs(batch)
    assert lone.status is RequestStatus.PREEMPTED and lone.num_computed_tokens == 0
    assert swap.host.num_used == 0 and not batch.blocks_to_swap_out


def test_bad_modes_are_refused():
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        SwapSpace(BlockManager(4, BLOCK, False), HostBlockPool(1), "sometimes", 1)
    with pytest.raises(ValueError, match="zero or more"):
        HostBlockPool(-1)
    pool = HostBlockPool(2)
    assert pool.allocate(3) is None and pool.num_free == 2
    with pytest.raises(RuntimeError, match="freed but not taken"):
        pool.free([0])
