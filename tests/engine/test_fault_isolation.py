"""No request can hurt another: any sampling parameters the validator accepts run beside
ordinary requests without changing their tokens or leaking a block, and a request whose
processing fails anyway is finished with an error while the rest of the batch goes on."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.sampler import Sampler
from kvdeck.engine.types.sampling_params import INT32_MAX, INT64_MAX, INT64_MIN, MAX_LOGPROBS

ORDINARY = [
    ("Paged attention stores keys", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)),
    ("Continuous batching schedules", SamplingParams(temperature=0.8, seed=7, max_tokens=10,
                                                     ignore_eos=True)),
]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_batched_tokens=64) as engine:
        yield engine


@pytest.fixture(scope="module")
def alone(llm):
    return [llm.generate(prompt, params)[0].outputs[0].token_ids for prompt, params in ORDINARY]


def edges(low, high, draw_between):
    """The bounds themselves, often; anything between, otherwise."""
    return st.one_of(st.sampled_from([low, high]), draw_between)


@st.composite
def accepted_params(draw, vocab_size: int) -> SamplingParams:
    max_tokens = draw(st.integers(1, 12))
    return SamplingParams(
        n=draw(st.integers(1, 3)),
        temperature=draw(edges(0.0, 1e6, st.floats(0, 5, allow_nan=False) | st.just(1e-50))),
        top_p=draw(edges(1e-9, 1.0, st.floats(1e-6, 1.0))),
        top_k=draw(edges(-1, INT32_MAX, st.integers(0, 2 * vocab_size))),
        min_p=draw(edges(0.0, 1.0, st.floats(0, 1))),
        presence_penalty=draw(edges(-2.0, 2.0, st.floats(-2, 2))),
        frequency_penalty=draw(edges(-2.0, 2.0, st.floats(-2, 2))),
        repetition_penalty=draw(edges(1e-9, 1e9, st.floats(0.01, 10))),
        seed=draw(st.none() | edges(INT64_MIN, INT64_MAX, st.integers(INT64_MIN, INT64_MAX))),
        max_tokens=max_tokens,
        min_tokens=draw(st.integers(0, max_tokens)),
        stop=draw(st.lists(st.text(min_size=1, max_size=8), max_size=3)),
        stop_token_ids=draw(st.lists(st.integers(0, vocab_size - 1), max_size=4)),
        ignore_eos=draw(st.booleans()),
        logprobs=draw(st.none() | st.integers(0, MAX_LOGPROBS)),
        skip_special_tokens=draw(st.booleans()),
    )


def assert_no_block_held(llm):
    manager = llm.engine.core.block_manager
    assert manager.num_free_blocks == manager.num_blocks, "a block leaked"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_accepted_params_never_hurt_ordinary_requests(llm, alone, data):
    drawn = data.draw(accepted_params(llm.engine.info.vocab_size))
    prompts = [prompt for prompt, _ in ORDINARY] + ["Prefix caching reuses"]
    outputs = llm.generate(prompts, [params for _, params in ORDINARY] + [drawn])
    assert [out.outputs[0].token_ids for out in outputs[:2]] == alone
    assert all(choice.finish_reason in ("stop", "length") for choice in outputs[2].outputs)
    assert len(outputs[2].outputs) == drawn.n
    assert_no_block_held(llm)


def test_a_request_that_fails_in_sampling_fails_alone(llm, alone, monkeypatch):
    """Whatever the validator missed: the sampler raises for one request (its seed), that
    request ends with finish_reason "error" and its message, the others' tokens are as
    alone, and every block is back."""
    real = Sampler._generator

    def fragile(self, request, device):
        if request.params.seed == 1234:
            raise RuntimeError("this generator cannot be made")
        return real(self, request, device)

    monkeypatch.setattr(Sampler, "_generator", fragile)
    doomed = SamplingParams(temperature=1.0, seed=1234, max_tokens=10)
    outputs = llm.generate([prompt for prompt, _ in ORDINARY] + ["Prefix caching reuses"],
                           [params for _, params in ORDINARY] + [doomed])
    assert [out.outputs[0].token_ids for out in outputs[:2]] == alone
    failed = outputs[2]
    assert failed.finished and failed.outputs[0].finish_reason == "error"
    assert "this generator cannot be made" in failed.error
    assert llm.engine.core.finish_counts["error"] >= 1
    assert_no_block_held(llm)


def test_a_failure_of_every_row_is_the_engines(llm, monkeypatch):
    """When no single request explains a failure, it is raised (the engine's, not theirs)."""

    def broken(self, logits, requests, masks=None):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(Sampler, "sample", broken)
    with pytest.raises(RuntimeError, match="the device fell over"):
        llm.generate(["a b c", "d e f"], SamplingParams(temperature=0, max_tokens=3))
    monkeypatch.undo()
    assert_no_block_held(llm)  # generate() aborted what it had queued
