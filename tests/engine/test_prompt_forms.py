"""vLLM's prompt forms offline: strings, token ids, TextPrompt and TokensPrompt dicts, one or a
list; dicts with keys kvdeck cannot honour are refused by name, with nothing queued."""

import pytest

from kvdeck import LLM, BeamSearchParams, SamplingParams, TextPrompt, TokensPrompt
from kvdeck.engine.types.prompts import batch_prompts, parse_prompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_model_len=128)


@pytest.fixture(scope="module")
def expected(llm):
    """The string prompt's output: every other form of the same prompt must give it."""
    out = llm.generate(TEXT, GREEDY)[0]
    return out.prompt_token_ids, out.outputs[0].token_ids


def _idle(llm) -> bool:
    stats = llm.stats()
    return stats.num_running == stats.num_waiting == 0 and sum(stats.block_ref_counts) == 0


def test_text_prompt_single_and_in_a_list(llm, expected):
    ids, tokens = expected
    for prompts in (TextPrompt(prompt=TEXT), [TextPrompt(prompt=TEXT)], {"prompt": TEXT}):
        (out,) = llm.generate(prompts, GREEDY)
        assert (out.prompt, out.prompt_token_ids, out.outputs[0].token_ids) == (TEXT, ids, tokens)


def test_tokens_prompt_single_and_in_a_list(llm, expected):
    ids, tokens = expected
    for prompts in (TokensPrompt(prompt_token_ids=ids), [TokensPrompt(prompt_token_ids=ids)]):
        (out,) = llm.generate(prompts, GREEDY)
        assert (out.prompt, out.prompt_token_ids, out.outputs[0].token_ids) == (None, ids, tokens)


def test_mixed_forms_in_one_batch_keep_their_order(llm, expected):
    ids, tokens = expected
    outs = llm.generate([TEXT, ids, {"prompt": TEXT}, {"prompt_token_ids": ids}], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [tokens] * 4
    assert [o.prompt for o in outs] == [TEXT, None, TEXT, None]


def test_the_engine_step_api_takes_dicts_too(llm, expected):
    ids, tokens = expected
    request_id = llm.engine.add_request(None, {"prompt_token_ids": ids}, GREEDY)
    finals = {}
    while llm.engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in llm.engine.step() if o.finished})
    assert finals[request_id].outputs[0].token_ids == tokens


def test_beam_search_takes_every_form(llm, expected):
    ids, _ = expected
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    outs = llm.beam_search([TEXT, ids, {"prompt": TEXT}, {"prompt_token_ids": ids}], params)
    first = [s.tokens for s in outs[0].sequences]
    assert all([s.tokens for s in out.sequences] == first for out in outs)
    assert [s.tokens for s in llm.beam_search({"prompt": TEXT}, params)[0].sequences] == first


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ({"prompt": TEXT, "multi_modal_data": {"image": None}},
         "multi_modal_data is not supported: kvdeck serves text-only models"),
        ({"prompt_token_ids": [1, 2], "mm_processor_kwargs": {}},
         "mm_processor_kwargs is not supported: kvdeck serves text-only models"),
        ({"prompt": TEXT, "cache_salt": "x"}, "unknown prompt key 'cache_salt'"),
        ({"promt": TEXT}, "unknown prompt key 'promt'"),
        ({}, "needs 'prompt'"),
        ({"prompt": TEXT, "prompt_token_ids": [1]}, "not both"),
        ({"prompt": [1, 2]}, "'prompt' must be a string"),
        ({"prompt_token_ids": "1 2"}, "'prompt_token_ids' must be a list"),
        ({"prompt_token_ids": [1, 2.5]}, "must be a string, a list of token ids"),
        ({"prompt_token_ids": []}, "must not be empty"),
        ({"prompt": ""}, "must not be empty"),
        ({"prompt_token_ids": [1, 10**9]}, "token ids must be integers"),
    ],
)
def test_bad_dict_prompts_are_refused_by_name(llm, prompt, message):
    for prompts in (prompt, [TEXT, prompt]):  # alone, or one bad prompt in a batch
        with pytest.raises(ValueError, match=message):
            llm.generate(prompts, GREEDY)
    with pytest.raises(ValueError, match=message):
        llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=2))
    assert _idle(llm)


@pytest.mark.parametrize("prompts", [[], (), 3.5, None, {1, 2}])
def test_bad_prompt_lists(prompts):
    with pytest.raises(ValueError, match="prompts must be a string, a list of token ids, a TextPrompt"):
        batch_prompts(prompts)


def test_forms_without_an_engine():
    assert parse_prompt({"prompt": "hi"}) == "hi"
    assert parse_prompt({"prompt_token_ids": (3, 4)}) == [3, 4]
    assert parse_prompt("hi") == "hi" and parse_prompt([3]) == [3]
    assert batch_prompts([3, 4]) == [[3, 4]]
    assert batch_prompts({"prompt": "a"}) == [{"prompt": "a"}]
    assert batch_prompts(["a", [1]]) == ["a", [1]]
