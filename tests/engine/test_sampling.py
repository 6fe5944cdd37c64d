"""Sampling: seeds, penalties, stops, logprobs, logit_bias, and rejection of bad parameters."""

from dataclasses import replace

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.wire import EngineCoreRequest


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)


def _tokens(llm, prompts, params):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_same_seed_same_tokens_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    alone = _tokens(llm, ["The quick brown fox"], seeded)[0]
    other = SamplingParams(temperature=1.2, max_tokens=20, ignore_eos=True)
    batch = llm.generate(
        ["Some other prompt", "The quick brown fox", "Hi there"], [other, seeded, other]
    )
    assert batch[1].outputs[0].token_ids == alone
    different = SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True)
    assert _tokens(llm, ["The quick brown fox"], different)[0] != alone


def test_top_k_one_is_greedy(llm):
    greedy = _tokens(llm, ["Paged attention"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    top1 = _tokens(llm, ["Paged attention"],
                   SamplingParams(temperature=0.9, top_k=1, max_tokens=8, ignore_eos=True))
    tiny_p = _tokens(llm, ["Paged attention"],
                     SamplingParams(temperature=0.9, top_p=1e-6, max_tokens=8, ignore_eos=True))
    assert greedy == top1 == tiny_p


def test_repetition_and_frequency_penalties_change_output(llm):
    base = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = _tokens(llm, ["The the the"], base)[0]
    penalised = _tokens(llm, ["The the the"], SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=5.0,
        frequency_penalty=2.0, presence_penalty=2.0))[0]
    assert penalised != plain
    assert len(set(penalised)) >= len(set(plain))


def test_stop_token_ids_and_min_tokens(llm):
    free_run = _tokens(llm, ["Hello"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop_id = free_run[3]
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.token_ids == free_run[: free_run.index(stop_id) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  stop_token_ids=[stop_id], min_tokens=6))[0].outputs[0]
    assert len(out.token_ids) >= 6 and stop_id not in out.token_ids[:5]


def test_max_tokens_finish_reason_length(llm):
    out = llm.generate("Hello", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert out.finished and out.outputs[0].finish_reason == "length"
    assert len(out.outputs[0].token_ids) == 5
    assert out.metrics.first_token_time >= out.metrics.arrival_time
    assert out.metrics.finished_time >= out.metrics.first_token_time


def test_logprobs_include_sampled_token(llm):
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                               ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 4
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert token_id in entry and len(entry) >= 3
        best = max(entry.values(), key=lambda lp: lp.logprob)
        assert best.token_id == token_id  # greedy picks the most likely token
        assert all(lp.logprob <= 0 for lp in entry.values())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", "hot"),
        ("top_p", 1.5),
        ("top_p", 0.0),
        ("top_k", -2),
        ("min_p", 2.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("repetition_penalty", 0.0),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("min_tokens", -1),
        ("logprobs", 50),
        ("n", 0),
        ("seed", 1.5),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_invalid_parameters_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field.rstrip("s") if field == "stop_token_ids" else field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_rejected():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)


def test_n_choices_are_the_seeded_single_requests(llm):
    # Parallel sampling fans out on the client side: choice j is a request with seed + j.
    prompts = ["The quick brown fox " * 6, "Hi there"]
    outs = llm.generate(prompts, SamplingParams(n=3, temperature=1.0, seed=40, max_tokens=10,
                                                ignore_eos=True))
    assert [[c.index for c in out.outputs] for out in outs] == [[0, 1, 2], [0, 1, 2]]
    for prompt, out in zip(prompts, outs):
        singles = [_tokens(llm, [prompt], SamplingParams(temperature=1.0, seed=40 + j, max_tokens=10,
                                                         ignore_eos=True))[0] for j in range(3)]
        assert [c.token_ids for c in out.outputs] == singles
        assert len({tuple(t) for t in singles}) == 3
    stats = llm.stats()
    assert stats.num_running == stats.num_waiting == 0 and sum(stats.block_ref_counts) == 0


def test_n_choices_share_the_prompt_blocks(tiny_llama_dir):
    # Once the first choice has computed the prompt's blocks, choices scheduled later hit
    # the cache (all but the block holding the last prompt token, which is recomputed).
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_batched_tokens=64)
    prompt = list(range(5, 5 + 48))  # three full blocks
    llm.generate([prompt], SamplingParams(n=4, temperature=1.0, max_tokens=4))
    # 64 tokens per step: choices 0 and 1 start together, 2 and 3 find two cached blocks each.
    assert llm.stats().prefix_cache_hits == 2 * 32


def test_bad_input_in_an_n_batch_leaves_nothing_queued(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["fine", [7] * 10_000], SamplingParams(n=2, max_tokens=4))
    stats = llm.stats()
    assert stats.num_running == stats.num_waiting == 0 and sum(stats.block_ref_counts) == 0


def test_the_core_takes_one_choice_per_request(llm):
    with pytest.raises(ValueError, match="n=2"):
        llm.engine.core.add_request(EngineCoreRequest("two", [5, 6, 7], SamplingParams(n=2)))


def test_one_choice_and_several_choice_requests_side_by_side(llm):
    # While every request has one choice, outputs pass through the front-end as they are; a
    # request of several choices about (and after it finishes) changes nothing for the others.
    engine = llm.engine
    single = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("one", [5, 6, 7], single)
    engine.add_request("pair", [8, 9], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=3,
                                                      ignore_eos=True))
    seen: dict[tuple[str, int], list[int]] = {}
    finished: list[str] = []
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        if steps == 6:  # after the pair has finished
            engine.add_request("late", [10, 11], single)
        for out in engine.step():
            assert out.request_id in ("one", "pair", "late") and len(out.outputs) == 1
            seen.setdefault((out.request_id, out.outputs[0].index), []).extend(out.delta_token_ids)
            if out.finished:
                finished.append(out.request_id)
    assert sorted(seen) == [("late", 0), ("one", 0), ("pair", 0), ("pair", 1)]
    assert [len(seen[key]) for key in sorted(seen)] == [12, 12, 3, 3]
    assert sorted(finished) == ["late", "one", "pair"] and not engine.frontend.requests
    alone = llm.generate([[5, 6, 7]], single)[0].outputs[0].token_ids
    assert seen[("one", 0)] == alone


def test_one_request_of_n_choices_in_the_step_api(llm):
    # The front-end owns the whole request: one id, outputs by choice index, one abort.
    engine = llm.engine
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=30, ignore_eos=True)
    engine.add_request("three", "The quick brown fox", params)
    assert engine.core.requests.keys() == {"three-0", "three-1", "three-2"}
    seen: set[int] = set()
    while len(seen) < 3:
        for out in engine.step():
            assert out.request_id == "three" and len(out.outputs) == 1
            seen.add(out.outputs[0].index)
    assert seen == {0, 1, 2} and not any(out.finished for out in engine.step())
    finals = engine.abort_request("three")
    assert [out.outputs[0].index for out in finals] == [0, 1, 2]
    assert [out.finished for out in finals] == [False, False, True]
    assert {out.outputs[0].finish_reason for out in finals} == {"abort"}
    assert not engine.has_unfinished_requests() and llm.stats().kv_cache_usage == 0
    with pytest.raises(ValueError, match="already in use"):  # an id one of its choices has
        engine.add_request("dup", "a", SamplingParams(n=2, max_tokens=2))
        engine.add_request("dup-1", "b", SamplingParams(max_tokens=2))
    engine.abort_request("dup")


def test_logit_bias_forces_and_bans_tokens_and_logprobs_stay_the_models(llm):
    base = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    plain = llm.generate(["Hello"], base)[0].outputs[0]
    forced = next(t for t in range(10, 100) if t not in plain.token_ids)
    out = llm.generate(["Hello"], replace(base, logit_bias={forced: 100}))[0].outputs[0]
    assert out.token_ids == [forced] * 6
    assert all(entry[forced].logprob < -1 for entry in out.logprobs)  # the model's, not the biased
    banned = llm.generate(["Hello"], replace(base, logit_bias={plain.token_ids[0]: -100}))[0].outputs[0]
    assert banned.token_ids[0] != plain.token_ids[0]
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)
    free = set(_tokens(llm, ["Hello"], sampled)[0])
    kept_out = _tokens(llm, ["Hello"], replace(sampled, logit_bias={t: -100 for t in free}))[0]
    assert free and not free & set(kept_out)


def test_logit_bias_under_async_scheduling_equals_the_synchronous_steps(tiny_llama_dir, llm):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={20: 3.5, 21: -2})
    prompts = ["Hello", "Paged attention", "The quick brown fox"]
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, async_scheduling=True) as pipelined:
        assert _tokens(pipelined, prompts, params) == _tokens(llm, prompts, params)


def test_logit_bias_token_ids_are_checked_against_the_vocabulary(llm):
    with pytest.raises(ValueError, match=r"logit_bias token ids must be in \[0, "):
        llm.generate(["Hello"], SamplingParams(logit_bias={10**6: 1.0}))
