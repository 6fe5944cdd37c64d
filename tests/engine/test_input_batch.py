"""The runner's persistent batch state: block-table rows kept across steps equal a rebuild
from the requests' lists after random add / step / abort interleavings (new blocks appended,
finished rows swapped out, preemption, rejected drafts, sliding-window releases), and a
step packed from them equals the same step packed from scratch."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import NO_BLOCK, Request, RequestStatus
from kvdeck.engine.core.scheduler import Scheduler
from kvdeck.engine.runner.block_table_rows import BlockTableRows
from kvdeck.engine.runner.input_batch import InputBatch
from kvdeck.engine.types.sampling_params import SamplingParams

BLOCK = 4


def _rebuild(owners, num_groups: int, width: int) -> np.ndarray:
    """[groups, len(owners), width] from the lists, released entries and padding 0."""
    out = np.zeros((num_groups, len(owners), width), dtype=np.int32)
    for i, owner in enumerate(owners):
        for group, table in enumerate(owner.block_tables):
            out[group, i, : len(table)] = [max(b, 0) for b in table]
    return out


def _packed_from_scratch(batch, block_size: int, num_groups: int, long_rope_from: int | None) -> dict:
    """The step as the runner packed it before the rows persisted: lists per request."""
    ids, positions, slots, tables, qsl, lens = [], [], [[] for _ in range(num_groups)], \
        [[] for _ in range(num_groups)], [0], []
    for request, n in zip(batch.requests, batch.num_new_tokens):
        start, end = request.num_computed_tokens, request.num_computed_tokens + n
        shift = long_rope_from if request.long_rope else 0
        chunk = ([request.token_id_at(start), *request.spec_token_ids] if request.spec_token_ids
                 else request.all_token_ids[start:end])
        ids += chunk
        positions += [p + shift for p in range(start, end)]
        for group, table in enumerate(request.block_tables):
            slots[group] += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
            tables[group] += [table] * (n if request.spec_token_ids else 1)
        if request.spec_token_ids:  # each token of a verify chunk attends alone
            qsl += [qsl[-1] + i + 1 for i in range(n)]
            lens += list(range(start + 1, end + 1))
        else:
            qsl.append(qsl[-1] + n)
            lens.append(end)
    width = -(-max(lens) // block_size)
    return {"input_ids": ids, "positions": positions, "query_start_loc": qsl, "seq_lens": lens,
            "slots": slots, "tables": [[[max(b, 0) for b in t[:width]] + [0] * (width - len(t[:width]))
                                        for t in group] for group in tables]}


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(0, 3), st.integers(0, 2), st.integers(0, 0)),
    st.tuples(st.just("abort"), st.integers(0, 40), st.integers(0, 0), st.integers(0, 0)),
)


@settings(max_examples=120, deadline=None)
@given(
    ops=st.lists(operation, min_size=1, max_size=60),
    num_blocks=st.integers(8, 24),
    budget=st.integers(3, 40),
    caching=st.booleans(),
    windows=st.sampled_from([(None,), (6,), (None, 5)]),
    long_rope_from=st.sampled_from([None, 10]),
    speculative=st.booleans(),
)
def test_rows_equal_a_rebuild_after_random_steps(ops, num_blocks, budget, caching, windows,
                                                 long_rope_from, speculative):
    bm = BlockManager(num_blocks * len(windows), BLOCK, caching, windows, track_changes=True)
    max_len = num_blocks * BLOCK
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=budget, max_model_len=max_len,
                      long_rope_from=long_rope_from, speculative=speculative)
    batch_state = InputBatch(torch.device("cpu"), BLOCK, len(windows), max_rows=2, max_blocks=2,
                             long_rope_from=long_rope_from)
    rows = batch_state.rows
    shadow = BlockTableRows(len(windows), 2, 2)  # the same rows, every owner looked at each step
    next_id, token = 0, 0
    for kind, a, b, c in ops:
        if kind == "add":
            prompt = [(c * 7 + i) % 11 for i in range(min(a, max_len - 1))]
            sched.add_request(Request(str(next_id), prompt, SamplingParams(max_tokens=b, ignore_eos=True),
                                      eos_token_ids=set()))
            next_id += 1
        elif kind == "step":
            if speculative:  # drafts on the running decodes
                for request in sched.running:
                    if not request.is_prefilling:
                        request.spec_token_ids = [(token + i) % 11 for i in range(a)]
            batch = sched.schedule()
            if batch.empty:
                continue
            inputs = batch_state.prepare(batch)
            shadow.rows_for(batch.requests)
            expected = _packed_from_scratch(batch, BLOCK, len(windows), long_rope_from)
            assert inputs.input_ids.tolist() == expected["input_ids"]
            assert inputs.positions.tolist() == expected["positions"]
            assert inputs.meta.query_start_loc.tolist() == expected["query_start_loc"]
            assert inputs.meta.seq_lens.tolist() == expected["seq_lens"]
            for group in range(len(windows)):
                slots, tables = inputs.meta.group(group)
                assert slots.tolist() == expected["slots"][group]
                assert tables.tolist() == expected["tables"][group]
            sampled = []
            for request, n in zip(batch.requests, batch.num_new_tokens):
                if request.spec_token_ids:  # b of its drafts accepted, then one more token
                    sampled.append([(token + i) % 11 for i in range(min(b, len(request.spec_token_ids)) + 1)])
                else:
                    done = request.num_computed_tokens + n == request.num_tokens
                    sampled.append(token % 11 if done else None)
                token += 1
            for request in sched.update_from_output(batch, sampled):
                batch_state.forget(request.request_id)
                shadow.forget(request.request_id)
        else:
            for request in sched.finish_requests({str(a)}, RequestStatus.FINISHED_ABORTED):
                batch_state.forget(request.request_id)
                shadow.forget(request.request_id)
        # Every row held is a running or preempted request's; rows of requests that ran since
        # their tables last changed equal the lists.
        owners = {r.request_id: r for r in [*sched.running, *sched.waiting]}
        assert set(rows.row_ids) <= set(owners)
        held = sum(b != NO_BLOCK for r in sched.running for t in r.block_tables for b in t)
        assert bm.num_held_entries == held
    # One more look at every row: brought up to date, each equals its rebuild.
    for state in (rows, shadow):
        ids = list(state.row_ids)
        owners = [next(r for r in [*sched.running, *sched.waiting] if r.request_id == i) for i in ids]
        state.rows_for(owners, changed=bm.take_changed() if state is rows else None)
        width = state.tables.shape[2]
        assert np.array_equal(state.live(), _rebuild(owners, len(windows), width))


def test_a_forgotten_row_is_swapped_out():
    rows = BlockTableRows(1, 4, 4)
    owners = [Request(str(i), [1], SamplingParams(), set()) for i in range(3)]
    for i, owner in enumerate(owners):
        owner.block_tables = [[10 * i + 1, 10 * i + 2]]
    assert rows.rows_for(owners) == [0, 1, 2]
    rows.forget("0")
    assert rows.row_ids == ["2", "1"] and rows.row_of == {"2": 0, "1": 1}
    assert rows.live()[0].tolist() == [[21, 22, 0, 0], [11, 12, 0, 0]]
    assert rows.tables[0, 2].tolist() == [0, 0, 0, 0]
    owners[1].block_tables[0].append(13)  # appended: only the tail is copied
    assert rows.rows_for([owners[1]]) == [1]
    assert rows.live()[0, 1].tolist() == [11, 12, 13, 0]
    owners[1].block_tables = [[7]]  # rewritten: a new epoch, the row copied whole
    owners[1].table_epoch += 1
    rows.rows_for([owners[1]])
    assert rows.live()[0, 1].tolist() == [7, 0, 0, 0]


def test_rows_grow_past_their_first_size():
    rows = BlockTableRows(1, 1, 1)
    owners = [Request(str(i), [1], SamplingParams(), set()) for i in range(3)]
    for i, owner in enumerate(owners):
        owner.block_tables = [list(range(i, i + 5))]
    rows.rows_for(owners)
    assert np.array_equal(rows.live(), _rebuild(owners, 1, rows.tables.shape[2]))
