"""Multi-LoRA in the engine: greedy tokens equal peft's merged model for the base and two
adapters in one batch (chunked prefill, prefix caching, preemption, speculative decoding);
the prefix cache never serves one adapter's blocks to another; at most max_loras adapters a
step; bad adapters are refused, by name, before anything is loaded."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from kvdeck import LLM, LoRARequest, SamplingParams
from tests.engine.lora.conftest import MAX_NEW, PROMPTS

GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
# Chunked prefill: the 40-token prompts take three steps each.
ENGINE = dict(enable_lora=True, max_num_batched_tokens=16, num_gpu_blocks_override=64, max_model_len=128)


def _tokens(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_base_and_two_adapters_in_one_batch_match_merged_peft(family, request):
    setup = request.getfixturevalue(f"lora_{family}")
    sql, code = setup.requests["sql"], setup.requests["code"]
    with LLM(str(setup.model_dir), **ENGINE) as llm:
        steps = _record_step_adapters(llm)
        got = _tokens(llm.generate(PROMPTS, GREEDY, lora_request=[None, sql, code]))
        assert got == [setup.expected(None, 0), setup.expected("sql", 1), setup.expected("code", 2)]
        assert any(len(ids) == 3 for ids in steps), "the three never shared a step"
        # The three prompts share their first 32 tokens, under three adapters: no block reused.
        assert llm.stats().prefix_cache_hits == 0
        # The same adapter does reuse them (two blocks each), and its tokens are still the
        # merged model's; three adapter rows of four take the torch path's every-row form.
        again = _tokens(llm.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1], PROMPTS[0]], GREEDY,
                                     lora_request=[sql, code, sql, None]))
        assert again == [setup.expected("sql", 2), setup.expected("code", 0), setup.expected("sql", 1),
                         setup.expected(None, 0)]
        assert llm.stats().prefix_cache_hits == 4 * 32
    # The adapters do change the output (else the test above would prove little).
    assert setup.expected("sql", 1) != setup.expected(None, 1)
    assert setup.expected("sql", 2) != setup.expected("code", 2)


def test_one_adapter_at_a_time_with_preemption(lora_llama):
    """max_loras=1: a step never holds two adapters, the base's request goes ahead of one
    waiting for a slot, and a pool too small for all preempts."""
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    with LLM(str(setup.model_dir), **{**ENGINE, "max_loras": 1, "num_gpu_blocks_override": 5,
                                      "max_model_len": 64}) as llm:
        steps = _record_step_adapters(llm)
        order = [(sql, 1), (code, 2), (None, 0), (sql, 2)]
        got = _tokens(llm.generate([PROMPTS[p] for _, p in order], GREEDY,
                                   lora_request=[lora for lora, _ in order]))
        stats = llm.stats()
    names = [None if lora is None else lora.lora_name for lora, _ in order]
    assert got == [setup.expected(name, p) for name, (_, p) in zip(names, order)]
    assert all(len(ids - {0}) <= 1 for ids in steps)
    # code waited while sql ran; the base request behind it in the queue went ahead.
    first_code = next(i for i, ids in enumerate(steps) if 2 in ids)
    assert next(i for i, ids in enumerate(steps) if 0 in ids) < first_code
    assert any(1 in ids for ids in steps[first_code:])  # the later sql request, after code
    assert stats.num_preemptions > 0


def test_speculative_verify_runs_with_adapters(lora_llama):
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    with LLM(str(setup.model_dir), **ENGINE, speculative_config=config) as llm:
        steps = _record_step_adapters(llm)
        got = _tokens(llm.generate(PROMPTS, GREEDY, lora_request=[code, None, sql]))
        spec = llm.stats().spec
    assert got == [setup.expected("code", 0), setup.expected(None, 1), setup.expected("sql", 2)]
    assert spec is not None and spec.num_draft_tokens > 0
    assert steps


def test_bad_adapters_are_refused_before_loading(lora_llama, lora_qwen3, tmp_path):
    setup = lora_llama
    other_layers = _edited_copy(setup.adapters["code"], tmp_path / "layers",
                                lambda key: key.replace("layers.1.", "layers.5."))
    lm_head = _edited_copy(setup.adapters["code"], tmp_path / "lm_head",
                           lambda key: key.replace("model.layers.1.mlp.down_proj", "lm_head"))
    with LLM(str(setup.model_dir), **ENGINE, max_lora_rank=8) as llm:
        cases = [
            (LoRARequest("wide", 3, str(lora_qwen3.adapters["code"])), "has rank 16, above max_lora_rank 8"),
            (LoRARequest("qwen", 3, str(lora_qwen3.adapters["sql"])), "made for another base model"),
            (LoRARequest("deep", 4, str(other_layers)), "layer 5; the base model has 2 layers"),
            (LoRARequest("head", 5, str(lm_head)), "has a tensor kvdeck cannot apply"),
            (LoRARequest("gone", 6, str(tmp_path / "nowhere")), "does not exist"),
        ]
        for lora, message in cases:
            with pytest.raises(ValueError, match=message):
                llm.generate([PROMPTS[0]], GREEDY, lora_request=lora)
            with pytest.raises(ValueError, match=message):
                llm.add_lora(lora)
        assert llm.list_loras() == []
        assert not llm.engine.has_unfinished_requests()
        # The engine goes on serving the good ones.
        code = setup.requests["code"]
        assert _tokens(llm.generate([PROMPTS[2]], GREEDY, lora_request=code)) == [setup.expected("code", 2)]
    with LLM(str(setup.model_dir), max_model_len=128, num_gpu_blocks_override=16) as plain:
        with pytest.raises(ValueError, match="LoRA is off"):
            plain.generate([PROMPTS[0]], GREEDY, lora_request=setup.requests["sql"])
        with pytest.raises(ValueError, match="LoRA is off"):
            plain.add_lora(setup.requests["sql"])


def test_add_remove_list(lora_llama):
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    with LLM(str(setup.model_dir), **ENGINE, max_loras=1, max_cpu_loras=1) as llm:
        assert llm.add_lora(sql) is True
        assert llm.add_lora(sql) is False
        assert llm.list_loras() == [1]
        with pytest.raises(ValueError, match="lora_int_id 1 is already adapter 'sql'"):
            llm.add_lora(LoRARequest("other", 1, str(setup.adapters["code"])))
        assert llm.add_lora(code) is True
        assert llm.list_loras() == [2]  # one host copy: the least recently used went
        # An adapter the host no longer holds is read again when a request needs it.
        assert _tokens(llm.generate([PROMPTS[1]], GREEDY, lora_request=sql)) == [setup.expected("sql", 1)]
        # Its host copy dropped again, sql still holds the slot: id 1 is still sql's.
        assert llm.add_lora(code) is True and llm.list_loras() == [2]
        with pytest.raises(ValueError, match="lora_int_id 1 is already adapter 'sql'"):
            llm.add_lora(LoRARequest("other", 1, str(setup.adapters["code"])))
        assert llm.remove_lora(1) is True
        assert llm.remove_lora(1) is False
        assert llm.remove_lora(2) is True
        assert llm.list_loras() == []
        # Requests carry their adapter's folder: a removed one is loaded again.
        assert _tokens(llm.generate([PROMPTS[2]], GREEDY, lora_request=code)) == [setup.expected("code", 2)]


def test_request_stats_name_the_adapter(lora_llama):
    setup = lora_llama
    with LLM(str(setup.model_dir), **ENGINE) as llm:
        llm.engine.add_request("a", PROMPTS[0], GREEDY, lora_request=setup.requests["sql"])
        llm.engine.add_request("b", PROMPTS[1], GREEDY)
        names = {r.request_id: r.lora_name for r in llm.stats().requests}
        assert names == {"a": "sql", "b": None}
        # While a request runs under id 1, id 1 names sql, even once its host copy is gone.
        llm.engine.core.runner.lora.host.clear()
        with pytest.raises(ValueError, match="lora_int_id 1 is adapter 'sql'"):
            llm.engine.add_request("c", PROMPTS[2], GREEDY,
                                   lora_request=LoRARequest("other", 1, str(setup.adapters["code"])))
        llm.engine.abort_request(["a", "b"])


def _record_step_adapters(llm: LLM) -> list[set[int]]:
    """The adapter ids (0: the base) of each step the runner plans from now on."""
    manager = llm.engine.core.runner.lora
    steps: list[set[int]] = []
    plan = manager.plan

    def recording(requests, num_new_tokens):
        steps.append({0 if getattr(r, "lora_request", None) is None else r.lora_request.lora_int_id
                      for r in requests})
        return plan(requests, num_new_tokens)

    manager.plan = recording
    return steps


def _edited_copy(adapter, out, rename):
    """A copy of an adapter folder with its tensors renamed by `rename(key)`."""
    shutil.copytree(adapter, out)
    tensors = load_file(out / "adapter_model.safetensors")
    save_file({rename(key): value for key, value in tensors.items()}, out / "adapter_model.safetensors")
    json.loads((out / "adapter_config.json").read_text())  # still the adapter's config
    return out
