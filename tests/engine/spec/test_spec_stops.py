"""max_tokens, stop token ids, EOS and stop strings inside an accepted run end the request at
exactly the right token; logprobs, seeds and n > 1 work under speculation.

The target is its own draft here, so every greedy draft is accepted and each step emits
k + 1 tokens: a stop condition almost always falls inside a run.
"""

import json

import pytest

from kvdeck import LLM, SamplingParams

PROMPT = "The quick brown fox"
K = 4


@pytest.fixture(scope="module")
def target(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def plain_llm(target):
    with LLM(str(target), kv_cache_memory_gib=0.01) as llm:
        yield llm


@pytest.fixture(scope="module")
def spec_llm(target):
    config = {"model": str(target), "num_speculative_tokens": K}
    with LLM(str(target), kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        yield llm


def _run(llm, params: SamplingParams, prompt=PROMPT):
    """The finished output, and how many tokens the last step's run had beyond what was kept."""
    engine = llm.engine
    engine.add_request(None, prompt, params)
    finished, dropped = None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished = out
                spec = llm.stats().spec
                if spec is not None and spec.last_step_draft_tokens:
                    dropped = spec.last_step_accepted_tokens + 1 - len(out.delta_token_ids)
    return finished, dropped


def _greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kwargs)


def test_max_tokens_exactly(plain_llm, spec_llm):
    for max_tokens in range(1, 12):
        plain, _ = _run(plain_llm, _greedy(max_tokens=max_tokens, ignore_eos=True))
        spec, _ = _run(spec_llm, _greedy(max_tokens=max_tokens, ignore_eos=True))
        assert spec.outputs[0].token_ids == plain.outputs[0].token_ids
        assert len(spec.outputs[0].token_ids) == max_tokens
        assert spec.outputs[0].finish_reason == "length"
    assert spec_llm.stats().spec.num_accepted_tokens > 0


def test_stop_token_inside_a_run(plain_llm, spec_llm):
    reference = _run(plain_llm, _greedy(max_tokens=30, ignore_eos=True))[0].outputs[0].token_ids
    truncated = 0
    for position in range(2, 14):
        stop = reference[position]
        first = reference.index(stop)
        spec, dropped = _run(spec_llm, _greedy(max_tokens=30, ignore_eos=True, stop_token_ids=[stop]))
        out = spec.outputs[0]
        assert out.token_ids == reference[: first + 1]
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)
        truncated += dropped > 0
    assert truncated, "no stop fell inside an accepted run: the test did not test it"


def test_eos_inside_a_run(target, tmp_path):
    with LLM(str(target), kv_cache_memory_gib=0.01) as llm:
        reference = _run(llm, _greedy(max_tokens=30, ignore_eos=True))[0].outputs[0].token_ids
    eos = reference[7]
    model = tmp_path / "eos-model"
    model.mkdir()
    for path in target.iterdir():
        (model / path.name).symlink_to(path)
    (model / "generation_config.json").unlink()
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    config = {"model": str(model), "num_speculative_tokens": K}
    with LLM(str(model), kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        spec, dropped = _run(llm, _greedy(max_tokens=30))
    assert spec.outputs[0].token_ids == reference[: reference.index(eos) + 1]
    assert spec.outputs[0].finish_reason == "stop"


def test_stop_string_inside_a_run(plain_llm, spec_llm):
    reference = _run(plain_llm, _greedy(max_tokens=30, ignore_eos=True))[0].outputs[0]
    tokenizer = plain_llm.get_tokenizer()
    checked = 0
    for position in range(3, 12):
        # A stop string made of the tail of one token's text and the head of the next.
        text = tokenizer.decode(reference.token_ids[: position + 1])
        head = tokenizer.decode(reference.token_ids[:position])
        stop = text[max(len(head) - 2, 0) : len(head) + 2]
        if len(stop) < 2 or reference.text.find(stop) != len(head) - 2:
            continue  # not a clean, first occurrence
        params = _greedy(max_tokens=30, ignore_eos=True, stop=[stop])
        plain, _ = _run(plain_llm, params)
        spec, _ = _run(spec_llm, params)
        assert spec.outputs[0].text == plain.outputs[0].text
        assert spec.outputs[0].token_ids == plain.outputs[0].token_ids
        assert (spec.outputs[0].finish_reason, spec.outputs[0].stop_reason) == ("stop", stop)
        checked += 1
    assert checked >= 2


def test_logprobs_match_non_speculative(plain_llm, spec_llm):
    params = _greedy(max_tokens=12, ignore_eos=True, logprobs=3)
    plain, _ = _run(plain_llm, params)
    spec, _ = _run(spec_llm, params)
    assert spec.outputs[0].token_ids == plain.outputs[0].token_ids
    for mine, theirs in zip(spec.outputs[0].logprobs, plain.outputs[0].logprobs):
        assert list(mine) == list(theirs)
        for token, entry in mine.items():
            assert entry.logprob == pytest.approx(theirs[token].logprob, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_n_choices_differ(spec_llm):
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=16, ignore_eos=True, n=3)
    first = spec_llm.generate([PROMPT], params)[0].outputs
    again = spec_llm.generate([PROMPT], params)[0].outputs
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) == 3
    assert spec_llm.stats().spec.num_drafts > 0


def test_logit_bias_matches_non_speculative(plain_llm, spec_llm):
    reference, _ = _run(plain_llm, _greedy(max_tokens=16, ignore_eos=True))
    # A bias that moves the greedy path midway: the drafts, proposed without it, get rejected there.
    bias = {reference.outputs[0].token_ids[5]: -100, 7: 2.5}
    params = _greedy(max_tokens=16, ignore_eos=True, logit_bias=bias)
    plain, _ = _run(plain_llm, params)
    spec, _ = _run(spec_llm, params)
    assert plain.outputs[0].token_ids != reference.outputs[0].token_ids
    assert spec.outputs[0].token_ids == plain.outputs[0].token_ids
