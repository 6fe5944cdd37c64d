"""Sliding-window models: kvdeck attends to the whole context, so it caps max_model_len
at the window, where that is the same computation as the model's own attention."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.model_config import model_config_from_dict
from tests.model_factory import build_tiny_model, hf_greedy

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4}


@pytest.mark.parametrize("fields, window", [
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, 4096),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": None}, None),
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": False}, None),
    # Qwen2's layers from max_window_layers on use the window: none here, two here.
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "use_sliding_window": True,
      "max_window_layers": 4}, None),
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "use_sliding_window": True,
      "max_window_layers": 2}, 512),
    ({"architectures": ["Qwen3ForCausalLM"], "sliding_window": 256,
      "layer_types": ["full_attention"] * 4}, None),
    ({"architectures": ["Qwen3ForCausalLM"], "sliding_window": 256,
      "layer_types": ["sliding_attention", "full_attention"] * 2}, 256),
])
def test_window_read_from_config(fields, window):
    assert model_config_from_dict({**BASE, **fields}).sliding_window == window


@pytest.fixture(scope="module")
def windowed_mistral(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("mistral_window"), "mistral", sliding_window=32)


def test_max_model_len_defaults_to_the_window(windowed_mistral):
    llm = LLM(str(windowed_mistral), kv_cache_memory_gib=0.01)
    assert llm.engine.max_model_len == 32
    with pytest.raises(ValueError, match="prompt has 40 tokens; max_model_len is 32"):
        llm.generate([[5] * 40], SamplingParams(max_tokens=1))
    assert llm.stats().num_waiting == 0


def test_max_model_len_past_the_window_is_refused(windowed_mistral):
    with pytest.raises(ValueError, match="sliding window of 32 tokens"):
        LLM(str(windowed_mistral), kv_cache_memory_gib=0.01, max_model_len=64)


def test_greedy_within_the_window_matches_transformers(windowed_mistral):
    llm = LLM(str(windowed_mistral), kv_cache_memory_gib=0.01)
    prompts = [[7, 8, 9, 10, 11, 12], list(range(3, 25))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == hf_greedy(windowed_mistral, prompts, 8)
