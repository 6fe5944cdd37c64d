"""Block accounting under speculative decoding: slots for all k + 1 tokens, rejected ones given
back, nothing unverified ever registered in the prefix cache, nothing leaked.

A fake model records which token's K/V each slot holds, so the checks compare real contents:
every computed position of a running request holds its own token, and every block in the
prefix cache holds exactly the tokens its hash names.
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import Request, RequestStatus
from kvdeck.engine.core.scheduler import Scheduler
from kvdeck.engine.types.sampling_params import SamplingParams

BLOCK = 4
VOCAB = 7  # few distinct tokens: drafts are often right, prefixes are often shared


def _check(bm: BlockManager, sched: Scheduler, kv: dict[int, int]) -> None:
    holders = Counter(b for r in sched.running for b in r.block_table)
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), "ref count != tables holding it"
    free = set(bm.free_uncached) | set(bm.evictable)
    in_use = {b.block_id for b in bm.blocks if b.ref_count > 0}
    assert len(free) == len(bm.free_uncached) + len(bm.evictable), "a block is free twice"
    assert not (free & in_use) and len(free) + len(in_use) == bm.num_blocks, "a block leaked"
    for request in sched.running:
        # No block is held beyond the verified tokens (rejected drafts were given back).
        assert len(request.block_table) == bm.blocks_needed(request.num_computed_tokens)
        for p in range(request.num_computed_tokens):
            slot = request.block_table[p // BLOCK] * BLOCK + p % BLOCK
            assert kv.get(slot) == request.token_id_at(p), "a computed slot holds another token"
    for (_, h), block_id in bm.hash_to_block.items():  # keyed by (KV group, hash)
        block = bm.blocks[block_id]
        assert block.hash == h
        contents = tuple(kv.get(block_id * BLOCK + i) for i in range(BLOCK))
        assert contents == block.token_ids, "the prefix cache holds a block with unverified K/V"
    for r in sched.waiting:
        assert not r.block_table and not r.spec_token_ids


def _run_step(sched: Scheduler, kv: dict[int, int], draws) -> None:
    batch = sched.schedule()
    sampled = []
    for request, n in zip(batch.requests, batch.num_new_tokens):
        drafts = request.spec_token_ids
        assert n >= 1 + len(drafts)
        tokens = request.all_token_ids + drafts
        for p in range(request.num_computed_tokens, request.num_computed_tokens + n):
            kv[request.block_table[p // BLOCK] * BLOCK + p % BLOCK] = tokens[p]  # the K/V write
        if request.num_computed_tokens + n - len(drafts) < request.num_tokens:
            sampled.append(None)  # mid-prefill
            continue
        accepted = draws(len(drafts))
        # Accepted drafts, then a token the target picked (never the rejected draft itself).
        bonus = (drafts[accepted] + 1) % VOCAB if accepted < len(drafts) else draws(VOCAB - 1)
        sampled.append(drafts[:accepted] + [bonus])
    sched.update_from_output(batch, sampled)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), num_blocks=st.integers(6, 20), budget=st.integers(2, 24),
       caching=st.booleans(), max_tokens=st.integers(1, 14))
def test_speculative_steps_keep_blocks_exact(data, num_blocks, budget, caching, max_tokens):
    bm = BlockManager(num_blocks, BLOCK, caching)
    max_len = num_blocks * BLOCK
    sched = Scheduler(bm, max_num_seqs=5, max_num_batched_tokens=budget, max_model_len=max_len)
    kv: dict[int, int] = {}
    draws = lambda high: data.draw(st.integers(0, high))
    for i in range(data.draw(st.integers(1, 6))):
        prompt = [(i % 2 + j) % VOCAB for j in range(data.draw(st.integers(1, min(12, max_len - 1))))]
        sched.add_request(Request(str(i), prompt, SamplingParams(max_tokens=max_tokens, stop_token_ids=[6]),
                                  eos_token_ids=set()))
    for _ in range(300):
        if not sched.has_unfinished_requests():
            break
        for request in sched.running:  # the proposer: up to 4 drafts for each decode
            if not request.is_prefilling:
                request.spec_token_ids = [draws(VOCAB - 1) for _ in range(draws(4))]
        if data.draw(st.integers(0, 9)) == 0 and sched.running:
            sched.finish_requests({sched.running[0].request_id}, RequestStatus.FINISHED_ABORTED)
        _run_step(sched, kv, draws)
        _check(bm, sched, kv)
    assert not sched.has_unfinished_requests()
    assert bm.num_free_blocks == num_blocks and bm.usage == 0.0


def test_stop_inside_an_accepted_run_drops_the_rest():
    bm = BlockManager(8, BLOCK, True)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=32)
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[5]), set())
    sched.add_request(request)
    sched.update_from_output(sched.schedule(), [4])
    request.spec_token_ids = [1, 5, 2, 3]
    batch = sched.schedule()
    assert batch.num_new_tokens == [5]
    finished = sched.update_from_output(batch, [[1, 5, 2, 3, 4]])
    assert finished == [request] and request.output_token_ids == [4, 1, 5]
    assert request.status is RequestStatus.FINISHED_STOPPED and request.stop_reason == 5
    assert bm.num_free_blocks == 8


def test_drafts_are_dropped_before_anyone_is_preempted():
    bm = BlockManager(2, BLOCK, False)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=8)
    request = Request("r", [1, 2], SamplingParams(max_tokens=5), set())
    sched.add_request(request)
    sched.update_from_output(sched.schedule(), [4])
    other = Request("o", [1, 2], SamplingParams(max_tokens=5), set())
    sched.add_request(other)
    sched.update_from_output(sched.schedule(), [4, 4])  # each holds one block: the pool is full
    request.spec_token_ids = [1, 1, 1]  # would need a second block
    batch = sched.schedule()
    assert batch.num_new_tokens == [1, 1] and not batch.preempted and request.spec_token_ids == []
