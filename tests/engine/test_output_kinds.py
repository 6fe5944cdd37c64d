"""What a request's outputs carry (SamplingParams.output_kind, vLLM's RequestOutputKind):
DELTA outputs add up to the CUMULATIVE ones, FINAL_ONLY is one output equal to the last
CUMULATIVE one; with text, stop strings, logprobs and n > 1 alike. And the offline LLM asks
for FINAL_ONLY (nothing built per token) with the same results."""

from dataclasses import replace

import pytest

from kvdeck import LLM
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams

PROMPTS = ["The quick brown", "Once upon"]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01) as llm:
        yield llm


def _run(llm, params: SamplingParams) -> dict[tuple[str, int], list]:
    """Every output of each (request, choice), in order."""
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    seen: dict[tuple[str, int], list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.setdefault((out.request_id, out.outputs[0].index), []).append(out)
    return seen


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.8, seed=3, max_tokens=10, n=2),
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, detokenize=False),
], ids=["text", "logprobs", "n2", "ids"])
def test_delta_and_final_only_carry_what_cumulative_does(llm, params):
    cumulative = _run(llm, params)
    delta = _run(llm, replace(params, output_kind=RequestOutputKind.DELTA))
    final = _run(llm, replace(params, output_kind=RequestOutputKind.FINAL_ONLY))
    assert cumulative.keys() == delta.keys() == final.keys()
    for key, outs in cumulative.items():
        last = outs[-1].outputs[0]
        pieces = [out.outputs[0] for out in delta[key]]
        assert [p.token_ids for p in pieces] == [out.delta_token_ids for out in delta[key]]
        assert sum((p.token_ids for p in pieces), []) == last.token_ids
        assert "".join(p.text for p in pieces) == last.text
        assert [out.delta_text for out in delta[key]] == [out.delta_text for out in outs]
        if last.logprobs is not None:
            assert sum((p.logprobs for p in pieces), []) == last.logprobs
        assert pieces[-1].finish_reason == last.finish_reason
        assert len(final[key]) == 1 and final[key][0].outputs[0].finish_reason is not None
        only = final[key][0].outputs[0]
        assert (only.token_ids, only.text, only.finish_reason, only.logprobs) == \
            (last.token_ids, last.text, last.finish_reason, last.logprobs)


def test_a_stop_string_ends_a_delta_stream_at_its_token(llm):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    text = _run(llm, params)[("r0", 0)][-1].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    delta = _run(llm, replace(params, stop=[stop], output_kind=RequestOutputKind.DELTA))[("r0", 0)]
    assert "".join(out.outputs[0].text for out in delta) == text[: text.index(stop)]
    assert delta[-1].outputs[0].finish_reason == "stop" and delta[-1].outputs[0].stop_reason == stop
    assert llm.stats().num_running == 0


def test_generate_asks_for_final_only_and_returns_the_same(llm):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, n=2, logprobs=1)
    stepped = _run(llm, params)
    outs = llm.generate(PROMPTS, params)
    for i, out in enumerate(outs):
        assert [c.token_ids for c in out.outputs] == \
            [stepped[(f"r{i}", k)][-1].outputs[0].token_ids for k in range(2)]
    assert params.output_kind is RequestOutputKind.CUMULATIVE  # the caller's params unchanged


def test_output_kind_is_checked():
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=1)
