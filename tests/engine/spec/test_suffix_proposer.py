"""The suffix cache (a tree per request, a global tree over recent outputs evicted first in,
first out) and the proposer on Requests: drafts from either tree, incremental catch-up,
the bounds on what is cached."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.suffix import SuffixProposer
from kvdeck.engine.core.spec.suffix_cache import SuffixCache
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.speculative import SpeculativeConfig
from tests.engine.spec.test_suffix_tree import brute_counts, brute_draft

TOKENS = st.lists(st.integers(0, 3), max_size=30)


@settings(max_examples=150, deadline=None)
@given(requests=st.lists(st.tuples(TOKENS, TOKENS), min_size=1, max_size=7),
       limit=st.integers(0, 3), depth=st.integers(2, 6))
def test_eviction_removes_exactly_the_evicted_outputs(requests, limit, depth):
    cache = SuffixCache(depth, limit)
    for i, (prompt, output) in enumerate(requests):
        cache.start(i, prompt)
        cache.add_output(i, output[: len(output) // 2])
        cache.add_output(i, output[len(output) // 2:])
        cache.stop(i)
        assert len(cache.cached) <= limit
    kept = list(range(len(requests)))[max(0, len(requests) - limit):] if limit else []
    assert list(cache.cached) == kept  # the newest `limit`, oldest first
    assert cache.global_tree.counts() == brute_counts([requests[i][1] for i in kept], depth)
    assert not cache.local_trees


@settings(max_examples=150, deadline=None)
@given(history=st.lists(TOKENS, max_size=3), prompt=TOKENS, output=TOKENS, k=st.integers(1, 8))
def test_proposals_are_the_better_trees_draft(history, prompt, output, k):
    config = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 8,
                                          "suffix_decoding_max_tree_depth": 6,
                                          "suffix_decoding_max_spec_factor": 2.0})
    proposer = SuffixProposer(config)
    for i, earlier in enumerate(history):  # finished requests: their outputs are cached
        done = Request(f"old{i}", [1], SamplingParams(), set())
        proposer.propose([done], [k])
        done.output_token_ids = list(earlier)
        proposer.forget(done.request_id)  # the tokens no propose saw are cached on the way out
    request = Request("r", prompt or [0], SamplingParams(), set())
    request.output_token_ids = output[: len(output) // 2]
    proposer.propose([request], [k])
    request.output_token_ids = list(output)  # the next call adds only the new tokens
    (got,) = proposer.propose([request], [k])
    tokens = request.all_token_ids
    local = brute_draft([tokens], 6, tokens, k, 2.0, 0.1)
    shared = brute_draft([*history, output], 6, tokens, k, 2.0, 0.1)
    assert got == (shared if shared[1] > local[1] else local)[0]


def test_a_finished_requests_output_drafts_for_the_next():
    config = SpeculativeConfig.from_dict({"method": "suffix"})
    proposer = SuffixProposer(config)
    call = list(range(100, 120))
    first = Request("a", [1, 2, 3], SamplingParams(), set())
    proposer.propose([first], [16])
    first.output_token_ids = [9, *call]
    proposer.forget("a")
    assert not proposer.tracked and not proposer.cache.local_trees
    second = Request("b", [4, 5, 6, 9, 100, 101, 102], SamplingParams(), set())
    (draft,) = proposer.propose([second], [16])
    assert draft == call[3:7]  # four matched tokens (9, 100, 101, 102): four drafted


def test_clearing_forgets_cached_outputs_and_keeps_running_requests():
    proposer = SuffixProposer(SpeculativeConfig.from_dict({"method": "suffix"}))
    done, running = (Request(i, [1, 2], SamplingParams(), set()) for i in "ab")
    proposer.propose([done, running], [4, 4])
    done.output_token_ids = [3, 4, 5, 6]
    proposer.forget("a")
    assert proposer.cache.global_tree.num_tokens == 4
    proposer.reset_cache()
    assert proposer.cache.global_tree.num_tokens == 0 and not proposer.cache.cached
    running.output_token_ids = [1, 2]
    assert proposer.propose([running], [4]) == [[1, 2]]  # its own tree still drafts: 1 2 1 2 -> 1 2


def test_a_zero_cache_keeps_no_outputs():
    proposer = SuffixProposer(SpeculativeConfig.from_dict(
        {"method": "suffix", "suffix_decoding_max_cached_requests": 0}))
    request = Request("a", [1, 2], SamplingParams(), set())
    proposer.propose([request], [4])
    request.output_token_ids = [3, 4, 5]
    proposer.forget("a")
    assert proposer.cache.global_tree.num_tokens == 0 and not proposer.cache.cached
