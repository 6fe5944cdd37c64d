"""Block manager and scheduler invariants under random add/step/abort interleavings."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import Request, RequestStatus
from kvdeck.engine.core.scheduler import Scheduler
from kvdeck.engine.types.sampling_params import SamplingParams

BLOCK = 4


def _check_invariants(bm: BlockManager, sched: Scheduler) -> None:
    holders = Counter(b for r in sched.running for b in r.block_table)
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), "ref count != tables holding it"
    free = set(bm.free_uncached) | set(bm.evictable)
    assert len(free) == len(bm.free_uncached) + len(bm.evictable), "a block is free twice"
    in_use = {b.block_id for b in bm.blocks if b.ref_count > 0}
    assert not (free & in_use), "a block is both free and in use"
    assert len(free) + len(in_use) == bm.num_blocks, "a block leaked"
    for block_id in bm.evictable:
        assert bm.blocks[block_id].hash is not None
    for h, block_id in bm.hash_to_block.items():
        assert bm.blocks[block_id].hash == h
    for r in sched.waiting:
        assert not r.block_table


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("abort"), st.integers(0, 40), st.integers(0, 0), st.integers(0, 0)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(operation, min_size=1, max_size=60),
    num_blocks=st.integers(8, 24),
    budget=st.integers(3, 40),
    caching=st.booleans(),
)
def test_random_interleavings_never_leak(ops, num_blocks, budget, caching):
    bm = BlockManager(num_blocks, BLOCK, caching)
    max_len = num_blocks * BLOCK
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=budget, max_model_len=max_len)
    next_id = 0
    token = 0
    for kind, a, b, c in ops:
        if kind == "add":
            # Few distinct prefixes so the prefix cache gets hits.
            prompt = [(c * 7 + i) % 11 for i in range(min(a, max_len - 1))]
            params = SamplingParams(max_tokens=b, ignore_eos=True)
            sched.add_request(Request(str(next_id), prompt, params, eos_token_ids=set()))
            next_id += 1
        elif kind == "step":
            batch = sched.schedule()
            _check_invariants(bm, sched)
            sampled = []
            for request, n in zip(batch.requests, batch.num_new_tokens):
                done = request.num_computed_tokens + n == request.num_tokens
                sampled.append(token % 11 if done else None)
                token += 1
            sched.update_from_output(batch, sampled)
        else:
            sched.finish_requests({str(a)}, RequestStatus.FINISHED_ABORTED)
        _check_invariants(bm, sched)
    # Drain: everything finishes and every block comes back.
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        batch = sched.schedule()
        sampled = [
            1 if r.num_computed_tokens + n == r.num_tokens else None
            for r, n in zip(batch.requests, batch.num_new_tokens)
        ]
        sched.update_from_output(batch, sampled)
        _check_invariants(bm, sched)
    assert not sched.has_unfinished_requests()
    assert bm.num_free_blocks == num_blocks and bm.usage == 0.0


def test_cached_block_reused_then_evicted_lru():
    bm = BlockManager(4, BLOCK, True)
    a = Request("a", list(range(9)), SamplingParams(), set())
    assert bm.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    assert len(a.block_hashes) == 2
    a_table = list(a.block_table)
    bm.free(a)
    assert bm.num_cached_free_blocks == 2 and bm.num_free_blocks == 4
    b = Request("b", list(range(8)) + [99, 98], SamplingParams(), set())
    ids, hashes = bm.find_cached_prefix(b)
    assert ids == a_table[:2] and len(hashes) == 2
    # The whole prompt matching still leaves the last token to compute.
    c = Request("c", list(range(8)), SamplingParams(), set())
    assert len(bm.find_cached_prefix(c)[0]) == 1
    # Filling the pool evicts cached blocks (least recently freed first).
    d = Request("d", [50] * 16, SamplingParams(), set())
    assert bm.allocate_slots(d, 16)
    assert bm.num_cached_free_blocks == 0
    assert bm.find_cached_prefix(b) == ([], [])


def test_allocation_failure_changes_nothing():
    bm = BlockManager(2, BLOCK, True)
    r = Request("r", list(range(12)), SamplingParams(), set())
    assert not bm.allocate_slots(r, 12)
    assert r.block_table == [] and bm.num_free_blocks == 2
