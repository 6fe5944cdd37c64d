"""The sampler's batched penalties and logprobs against per-row references: transformers'
repetition-penalty processor, OpenAI's presence/frequency formula, a plain log_softmax."""

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from kvdeck.engine.core.request import Request
from kvdeck.engine.runner.sampler import Sampler
from kvdeck.engine.types.sampling_params import SamplingParams

VOCAB = 50
EOS = 3


def _request(prompt, output, **params) -> Request:
    request = Request(f"r{len(prompt)}-{len(output)}", list(prompt), SamplingParams(**params), {EOS})
    request.output_token_ids = list(output)
    return request


def _reference(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    out = logits.clone()
    for row, request in enumerate(requests):
        p = request.params
        if request.num_output_tokens < p.min_tokens:
            ends = list(p.stop_token_ids) + ([] if p.ignore_eos else [EOS])
            out[row, ends] = float("-inf")
        if p.repetition_penalty != 1.0:
            ids = torch.tensor([request.all_token_ids])
            out[row] = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, out[row : row + 1])[0]
        counts = torch.bincount(torch.tensor(request.output_token_ids, dtype=torch.long), minlength=VOCAB)
        out[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return out


def test_penalties_match_the_per_row_references():
    gen = torch.Generator().manual_seed(0)
    requests = [
        _request([5, 6, 6, 7], [8, 8, 9, 5], repetition_penalty=1.3),
        _request([10, 11], [12, 12, 12, 13], frequency_penalty=0.7, presence_penalty=0.4),
        _request([1, 2], [], min_tokens=2, stop_token_ids=[4]),
        _request([20, 21, 22], [23, 20], repetition_penalty=0.8, frequency_penalty=-0.5,
                 presence_penalty=1.5, min_tokens=5, ignore_eos=True, stop_token_ids=[7]),
        _request([30], [31, 32]),  # no penalty at all
    ]
    logits = torch.randn(len(requests), VOCAB, generator=gen) * 3
    got = Sampler(torch.device("cpu"), seed=0)._apply_penalties(logits.clone(), requests)
    torch.testing.assert_close(got, _reference(logits, requests), rtol=1e-6, atol=1e-6)


def test_logprobs_for_some_rows_of_a_batch():
    gen = torch.Generator().manual_seed(1)
    requests = [_request([1], [], temperature=0, logprobs=3), _request([2], [], temperature=0),
                _request([3], [], temperature=0, logprobs=0)]
    logits = torch.randn(3, VOCAB, generator=gen)
    results = Sampler(torch.device("cpu"), seed=0).sample(logits, requests)
    reference = torch.log_softmax(logits, dim=-1)
    assert results[1].logprobs is None
    for row, top in ((0, 3), (2, 0)):
        token = int(logits[row].argmax())
        assert results[row].token_id == token
        expected_ids = [token] + [int(i) for i in reference[row].topk(top).indices if int(i) != token]
        assert list(results[row].logprobs) == expected_ids
        for token_id, entry in results[row].logprobs.items():
            assert entry.logprob == float(reference[row, token_id])


def test_a_plain_greedy_batch_takes_the_argmax_as_the_general_path_does():
    # plain_greedy (greedy, no penalty, no min_tokens, no logprobs) skips the look at each
    # row's settings; a batch with any other row takes the general path, row for row the same.
    gen = torch.Generator().manual_seed(2)
    plain = [_request([1, 2], [3], temperature=0), _request([4], [], temperature=0, max_tokens=3)]
    assert all(r.params.plain_greedy for r in plain)
    others = [_request([5], [], temperature=0, min_tokens=1), _request([6], [7], temperature=0, logprobs=1),
              _request([8], [9], temperature=0, presence_penalty=0.5), _request([1], [], temperature=0.7)]
    assert not any(r.params.plain_greedy for r in others)
    assert others[2].params.has_penalties and not others[0].params.has_penalties
    logits = torch.randn(2, VOCAB, generator=gen)
    sampler = Sampler(torch.device("cpu"), seed=0)
    fast = [r.token_id for r in sampler.sample(logits, plain)]
    assert fast == logits.argmax(dim=-1).tolist()
    mixed = sampler.sample(torch.cat([logits, logits[:1]]), [*plain, others[1]])
    assert [r.token_id for r in mixed[:2]] == fast and mixed[2].logprobs is not None
    made = torch.tensor([3, 1])  # a decode graph's argmax is taken as it is
    assert sampler.sample_on_device(logits, plain, greedy=made).tokens is made
