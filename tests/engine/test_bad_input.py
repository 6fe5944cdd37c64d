"""Bad input gets a ValueError naming the problem and leaves the engine's state unchanged."""

import json
import shutil

import pytest
import torch

from kvdeck import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_model_len=128)


def _state(llm):
    s = llm.stats()
    return (s.num_running, s.num_waiting, s.kv_cache_usage, tuple(s.block_ref_counts))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt must not be empty"),
        ([], "non-empty"),
        ([5] * 128, "max_model_len"),
        ([1, 2, 10**9], "token ids"),
        ([1, -4], "token ids"),
        (3.5, "must be a string"),
        ([1, True], "must be a string"),  # a bool is no token id
        ([4, 2.0], "must be a string"),
    ],
)
def test_bad_prompt(llm, prompt, message):
    before = _state(llm)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, SamplingParams(max_tokens=4))
    assert _state(llm) == before


def test_the_core_checks_token_ids_again(llm):
    # What reaches the core unchecked: a bool, a float or an id out of range is refused; an
    # int subclass other than bool is an int.
    from enum import IntEnum

    from kvdeck.engine.types.wire import EngineCoreRequest

    class Token(IntEnum):
        FIVE = 5

    before = _state(llm)
    for ids in ([1, True], [1, 2.0], [3, 400000], [-1]):
        with pytest.raises(ValueError, match="token ids"):
            llm.engine.core.add_request(EngineCoreRequest("bad", ids, SamplingParams(max_tokens=2)))
    assert _state(llm) == before
    llm.engine.core.limits.check([Token.FIVE, 6], SamplingParams())


def test_one_bad_prompt_in_a_batch_queues_nothing(llm):
    before = _state(llm)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["fine", [7] * 500], SamplingParams(max_tokens=4))
    assert _state(llm) == before
    assert llm.generate("fine", SamplingParams(max_tokens=3, ignore_eos=True))[0].finished


def test_bad_stop_token_id(llm):
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate("hi", SamplingParams(stop_token_ids=[10**7]))


def test_abort_mid_generation_frees_blocks(llm):
    engine = llm.engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    engine.add_request("keep", "The quick brown fox", params)
    engine.add_request("drop", "Paged attention " * 5, params)
    for _ in range(3):
        engine.step()
    engine.abort_request("drop")
    assert [r.request_id for r in engine.stats().requests] == ["keep"]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().kv_cache_usage == 0
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", "a", params)
        engine.add_request("x", "b", params)
    engine.abort_request("x")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("block_size", 12, "block_size"),
        ("max_num_seqs", 0, "max_num_seqs"),
        ("gpu_memory_utilization", 1.5, "gpu_memory_utilization"),
        ("dtype", "float8", "dtype"),
        ("quantization", "gptq", "quantization"),
        ("attention_backend", "flash", "attention_backend"),
        ("device", "tpu", "device"),
        ("load_format", "pt", "load_format"),
        ("trust_remote_code", True, "trust_remote_code"),
        ("no_such_option", 1, "unknown engine option"),
    ],
)
def test_bad_config(tiny_llama_dir, option, value, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama_dir), **{option: value})


def test_unknown_path():
    with pytest.raises(ValueError, match="neither a directory nor a hub id"):
        LLM("/no/such/model/dir")


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*not supported"):
        LLM(str(tmp_path / "m"))


def test_missing_weights_and_pickle_refused(tiny_llama_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, model)
    weights = next(model.glob("*.safetensors"))
    from safetensors.torch import load_file

    state = load_file(weights)
    weights.unlink()
    with pytest.raises(ValueError, match="no weight files"):
        LLM(str(model))
    torch.save(state, model / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle"):
        LLM(str(model))
    llm = LLM(str(model), allow_pickle=True, kv_cache_memory_gib=0.01)
    assert llm.generate("hi", SamplingParams(max_tokens=2, ignore_eos=True))[0].finished


def test_checkpoint_missing_a_tensor(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, model)
    weights = next(model.glob("*.safetensors"))
    state = load_file(weights)
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, weights)
    with pytest.raises(ValueError, match="lacks 1 weights: model.layers.1.mlp.down_proj.weight"):
        LLM(str(model))


def test_missing_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        LLM(str(tmp_path / "empty"))
