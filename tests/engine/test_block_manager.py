"""Block manager and scheduler invariants under random add/step/abort interleavings, with
one KV group or several (hybrid sliding-window models), and the window's release of blocks."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import NO_BLOCK, Request, RequestStatus
from kvdeck.engine.core.scheduler import Scheduler
from kvdeck.engine.types.sampling_params import SamplingParams

BLOCK = 4


def _check_invariants(bm: BlockManager, sched: Scheduler) -> None:
    holders = Counter(b for r in sched.running for table in r.block_tables for b in table
                      if b != NO_BLOCK)
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), "ref count != tables holding it"
    free = set(bm.free_uncached) | set(bm.evictable)
    assert len(free) == len(bm.free_uncached) + len(bm.evictable), "a block is free twice"
    in_use = {b.block_id for b in bm.blocks if b.ref_count > 0}
    assert not (free & in_use), "a block is both free and in use"
    assert len(free) + len(in_use) == bm.num_blocks, "a block leaked"
    for block_id in bm.evictable:
        assert bm.blocks[block_id].hash is not None
    for (group, h), block_id in bm.hash_to_block.items():
        assert (bm.blocks[block_id].group, bm.blocks[block_id].hash) == (group, h)
    for r in sched.running:
        assert len(r.block_tables) == bm.num_groups
        needed = bm.blocks_needed(r.num_computed_tokens)
        for window, table in zip(bm.windows, r.block_tables):
            assert len(table) == len(r.block_tables[0]) >= needed, "groups cover the same positions"
            # Held: every block the next query can see (a window's worth, or all).
            first_seen = 0 if window is None else max(0, r.num_computed_tokens - window + 1) // BLOCK
            assert NO_BLOCK not in table[first_seen:]
            if window is None:
                assert NO_BLOCK not in table
    for r in sched.waiting:
        assert not r.block_tables


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0)),
    st.tuples(st.just("abort"), st.integers(0, 40), st.integers(0, 0), st.integers(0, 0)),
)


# KV groups: one full-attention group, one windowed, a hybrid (full + windowed groups).
GROUP_WINDOWS = [(None,), (6,), (None, 5, 5), (9, None)]


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(operation, min_size=1, max_size=60),
    num_blocks=st.integers(8, 24),
    budget=st.integers(3, 40),
    caching=st.booleans(),
    windows=st.sampled_from(GROUP_WINDOWS),
    long_rope_from=st.sampled_from([None, 10]),
)
def test_random_interleavings_never_leak(ops, num_blocks, budget, caching, windows, long_rope_from):
    bm = BlockManager(num_blocks * len(windows), BLOCK, caching, windows)
    max_len = num_blocks * BLOCK
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=budget, max_model_len=max_len,
                      long_rope_from=long_rope_from)
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
    assert bm.num_free_blocks == bm.num_blocks and bm.usage == 0.0


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
    hit = bm.find_cached_prefix(b)
    assert hit.tables == [a_table[:2]] and len(hit.hashes) == hit.num_blocks == 2
    # The whole prompt matching still leaves the last token to compute.
    c = Request("c", list(range(8)), SamplingParams(), set())
    assert bm.find_cached_prefix(c).num_blocks == 1
    # Filling the pool evicts cached blocks (least recently freed first).
    d = Request("d", [50] * 16, SamplingParams(), set())
    assert bm.allocate_slots(d, 16)
    assert bm.num_cached_free_blocks == 0
    assert bm.find_cached_prefix(b).num_blocks == 0


def test_long_rope_blocks_never_serve_short_requests():
    """LongRoPE: the same tokens rotated with the long factors are other K/V."""
    bm = BlockManager(8, BLOCK, True)
    hashes = {}
    for long_rope in (False, True):
        request = Request("r", list(range(9)), SamplingParams(), set(), long_rope=long_rope)
        assert bm.find_cached_prefix(request).num_blocks == 0  # the other kind is no hit
        assert bm.allocate_slots(request, 9)
        request.num_computed_tokens = 9
        bm.cache_full_blocks(request)
        hashes[long_rope] = list(request.block_hashes)
        bm.free(request)
    assert not set(hashes[False]) & set(hashes[True])
    for long_rope in (False, True):
        hit = bm.find_cached_prefix(Request("x", list(range(9)), SamplingParams(), set(),
                                            long_rope=long_rope))
        assert hit.num_blocks == 2 and hit.hashes == hashes[long_rope]


def test_growing_past_the_long_rope_context_recomputes():
    bm = BlockManager(8, BLOCK, True)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=32,
                      long_rope_from=10)
    request = Request("r", list(range(9)), SamplingParams(max_tokens=8, ignore_eos=True), set())
    sched.add_request(request)
    sched.update_from_output(sched.schedule(), [5])  # 9 prompt tokens computed, 10 known
    batch = sched.schedule()  # a decode at position 9: still the short factors
    assert batch.num_new_tokens == [1] and not request.long_rope
    sched.update_from_output(batch, [6])  # 11 tokens: past the context
    batch = sched.schedule()
    assert request.long_rope and batch.num_new_tokens == [11]  # everything again
    assert request.num_computed_tokens == 0


def test_allocation_failure_changes_nothing():
    bm = BlockManager(2, BLOCK, True)
    r = Request("r", list(range(12)), SamplingParams(), set())
    assert not bm.allocate_slots(r, 12)
    assert r.block_table == [] and bm.num_free_blocks == 2


def _generate(bm: BlockManager, request: Request, num_tokens: int) -> list[list[int]]:
    """Compute `num_tokens` tokens one at a time (decode steps); the tables after each."""
    history = []
    for _ in range(num_tokens):
        assert bm.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        request.output_token_ids.append(len(request.output_token_ids) % 7)
        bm.cache_full_blocks(request)
        bm.release_out_of_window(request)
        history.append([list(t) for t in request.block_tables])
    return history


def test_window_blocks_are_released_and_reused():
    """A windowed group holds only the blocks its next query sees; what it releases goes
    back to the pool and serves the same request's later positions."""
    window = 10  # the next query sees 10 keys: at most 3 blocks of 4 (a window's edge)
    bm = BlockManager(5, BLOCK, True, (window,))
    r = Request("r", [1, 2, 3], SamplingParams(), set())
    r.num_computed_tokens = 0
    r.output_token_ids = []
    assert bm.allocate_slots(r, 3)
    r.num_computed_tokens = 3
    history = _generate(bm, r, 60)
    table = history[-1][0]
    assert len(table) == bm.blocks_needed(63)  # logical positions all covered
    held = [b for b in table if b != NO_BLOCK]
    assert len(held) <= 1 + -(-(window - 1) // BLOCK)
    assert bm.num_window_released == len(table) - len(held)
    # 16 logical blocks were served by a 5-block pool: released blocks were handed out again.
    assert len(table) > bm.num_blocks
    assert bm.num_free_blocks == bm.num_blocks - len(held)


def test_hybrid_keeps_the_full_groups_blocks():
    bm = BlockManager(40, BLOCK, True, (None, 6))
    r = Request("r", list(range(5)), SamplingParams(), set())
    assert bm.allocate_slots(r, 5)
    r.num_computed_tokens = 5
    _generate(bm, r, 40)
    full, windowed = r.block_tables
    assert NO_BLOCK not in full and len(full) == bm.blocks_needed(45)
    assert windowed.count(NO_BLOCK) == bm.num_window_released > 0
    assert sum(b != NO_BLOCK for b in windowed) <= 3


def test_window_prefix_hit_needs_only_the_windows_blocks():
    """A windowed group is served by its last cached blocks: the ones before can be
    evicted (or released) and the hit still covers the whole prefix."""
    bm = BlockManager(12, BLOCK, True, (6,))
    a = Request("a", list(range(21)), SamplingParams(), set())
    assert bm.allocate_slots(a, 21)
    a.num_computed_tokens = 21
    bm.cache_full_blocks(a)
    table = list(a.block_table)
    bm.free(a)
    # Evict the two oldest blocks: the window (6 keys, 2 blocks) does not need them.
    for block_id in table[:2]:
        bm._drop_hash(bm.blocks[block_id])
    b = Request("b", list(range(21)) + [7, 7, 7], SamplingParams(), set())
    hit = bm.find_cached_prefix(b)
    assert hit.num_blocks == 5
    assert hit.tables == [[NO_BLOCK] * 3 + table[3:5]]
    assert bm.allocate_slots(b, 4, hit)
    assert b.block_table[:5] == [NO_BLOCK] * 3 + table[3:5] and len(b.block_table) == 6
    # Without the window (full attention), the evicted head ends the hit at once.
    full = BlockManager(12, BLOCK, True, (None,))
    c = Request("c", list(range(21)), SamplingParams(), set())
    assert full.allocate_slots(c, 21)
    c.num_computed_tokens = 21
    full.cache_full_blocks(c)
    head = c.block_table[0]
    full.free(c)
    full._drop_hash(full.blocks[head])
    assert full.find_cached_prefix(b).num_blocks == 0
