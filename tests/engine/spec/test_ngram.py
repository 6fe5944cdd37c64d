"""The n-gram proposer against a plain per-request reference, over random batches."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.ngram import NgramProposer
from kvdeck.engine.types.sampling_params import SamplingParams


def _reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest n first; for it, the latest earlier occurrence; what followed it."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@settings(max_examples=200, deadline=None)
@given(seqs=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=30),
                               st.lists(st.integers(0, 3), max_size=20), st.integers(1, 5)),
                     min_size=1, max_size=6),
       bounds=st.tuples(st.integers(1, 3), st.integers(0, 3)))
def test_matches_the_reference(seqs, bounds):
    min_n, extra = bounds
    proposer = NgramProposer(min_n, min_n + extra)
    requests, ks = [], []
    for i, (prompt, output, k) in enumerate(seqs):
        request = Request(str(i), prompt, SamplingParams(), set())
        request.output_token_ids = output[: len(output) // 2]
        proposer.propose([request], [k])  # a first call sees part of the output ...
        request.output_token_ids = list(output)  # ... the next only the new tokens are copied
        requests.append(request)
        ks.append(k)
    got = proposer.propose(requests, ks)
    assert got == [_reference(r.all_token_ids, k, min_n, min_n + extra) for r, k in zip(requests, ks)]


def test_a_loop_is_continued_and_forget_drops_state():
    proposer = NgramProposer(2, 4)
    request = Request("r", [7, 1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(), set())
    assert proposer.propose([request], [4]) == [[3, 1, 2]]  # only 3 tokens follow the match
    proposer.forget("r")
    assert not proposer.buffers
