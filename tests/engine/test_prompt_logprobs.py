"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's): each prompt token's logprob
under the model, equal to transformers' over chunked prefill, never read from the prefix
cache, kept whole through a preemption; and cumulative_logprob."""

import random

import pytest
import torch
import transformers

from kvdeck import LLM, SamplingParams
from kvdeck.engine.core.request import Request
from kvdeck.engine.types.outputs import Logprob
from kvdeck.engine.types.sampling_params import RequestOutputKind

PROMPT = [(7 * i + 3) % 250 + 5 for i in range(70)]  # chunked: more than the step's 32 tokens


@pytest.fixture(scope="module")
def reference(tiny_llama_dir) -> torch.Tensor:
    """transformers' logprobs at every prompt position (row i predicts token i + 1)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), max_num_batched_tokens=32, kv_cache_memory_gib=0.01,
             max_model_len=160, enable_prefix_caching=True) as llm:
        yield llm


def _chosen(out) -> list[float]:
    return [entry[token].logprob for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:],
                                                         strict=True)]


def test_prompt_logprobs_equal_transformers_over_chunked_prefill(llm, reference):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3))[0]
    assert len(out.prompt_logprobs) == len(PROMPT) and out.prompt_logprobs[0] is None
    expected = reference[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    assert torch.allclose(torch.tensor(_chosen(out)), expected, atol=1e-4)
    for position, entry in enumerate(out.prompt_logprobs[1:]):
        row = reference[position]
        best = row.topk(3)
        for rank, (value, token) in enumerate(zip(best.values.tolist(), best.indices.tolist()), 1):
            assert entry[token].rank == rank and entry[token].logprob == pytest.approx(value, abs=1e-4)
        token = PROMPT[position + 1]
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        assert len(entry) in (3, 4) and entry[token].decoded is not None


def test_the_prefix_cache_never_serves_them_and_still_serves_the_others(llm):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0)
    queries = llm.stats().prefix_cache_queries
    first, again = (llm.generate([PROMPT], params)[0] for _ in range(2))
    assert again.num_cached_tokens == 0 and _chosen(again) == _chosen(first)
    assert llm.stats().prefix_cache_queries == queries  # no lookup made, none counted: the hit rate holds
    assert all(len(entry) == 1 for entry in again.prompt_logprobs[1:])  # the token alone, k=0
    plain = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.num_cached_tokens > 0 and plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == again.outputs[0].token_ids


def test_a_one_token_prompt_has_only_the_first_entry(llm):
    out = llm.generate([[42]], SamplingParams(max_tokens=2, prompt_logprobs=2))[0]
    assert out.prompt_logprobs == [None]


def test_cumulative_logprob_is_the_sum_of_the_chosen_tokens(llm):
    out = llm.generate([PROMPT[:10]], SamplingParams(temperature=1.0, seed=5, max_tokens=6, logprobs=0,
                                                     ignore_eos=True))[0].outputs[0]
    total = sum(entry[token].logprob for token, entry in zip(out.token_ids, out.logprobs, strict=True))
    assert out.cumulative_logprob == pytest.approx(total)
    bare = llm.generate([PROMPT[:10]], SamplingParams(max_tokens=2))[0].outputs[0]
    assert bare.cumulative_logprob is None  # vLLM's: only with logprobs


def test_delta_outputs_carry_them_once(llm):
    engine = llm.engine
    engine.add_request("delta-1", PROMPT[:20], SamplingParams(
        temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1,
        output_kind=RequestOutputKind.DELTA))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "delta-1"]
    carrying = [o for o in outs if o.prompt_logprobs is not None]
    assert len(outs) == 4 and carrying == outs[:1] and len(carrying[0].prompt_logprobs) == 20


def test_recompute_preemption_keeps_one_entry_per_prompt_token(tiny_llama_dir, reference):
    """A pool too small for all at once: requests are preempted and their prompts computed
    again; each still gets exactly one entry per token, equal to the unpreempted ones."""
    rng = random.Random(1)
    prompts = [PROMPT] + [[rng.randrange(5, 250) for _ in range(50)] for _ in range(5)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, prompt_logprobs=1)
    with LLM(str(tiny_llama_dir), max_num_batched_tokens=32, num_gpu_blocks_override=16,
             max_model_len=160, preemption_mode="recompute") as llm:
        outs = llm.generate(prompts, params)
        assert llm.stats().num_preemptions > 0
    expected = reference[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    assert torch.allclose(torch.tensor(_chosen(outs[0])), expected, atol=1e-4)
    assert [len(o.prompt_logprobs) for o in outs] == [len(p) for p in prompts]


def test_a_chunk_computed_again_adds_only_what_is_new():
    request = Request("r", list(range(6)), SamplingParams(prompt_logprobs=0), set())
    entry = [{i: Logprob(i, -float(i))} for i in range(1, 6)]
    request.add_prompt_logprobs(0, entry[:3])
    assert request.needs_prompt_logprobs
    request.add_prompt_logprobs(0, entry[:2])  # recomputed after a preemption: nothing new
    request.add_prompt_logprobs(2, entry[2:])
    assert request.prompt_logprobs == entry and not request.needs_prompt_logprobs
    assert request.take_prompt_logprobs() == entry and request.take_prompt_logprobs() is None


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_bad_values_are_refused_by_name(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)
