"""Gemma 2, Gemma 3 and Phi-3 generate token for token what transformers does, well past the
local layers' window and Phi-3's original context, with chunked prefill, prefix caching
and preemption; every block comes back."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.model_config import model_config_from_dict
from tests.model_factory import build_tiny_model, hf_greedy

WINDOW = 20  # Gemma's local layers; not a multiple of the block size
MAX_NEW = 64
# A pool too small for the three prompts at once, and a max_model_len one request fits in
# (a hybrid Gemma request holds all its global-layer blocks plus a window's local ones).
SMALL_POOL = {"gemma2": (12, 128), "gemma3": (12, 128), "phi3": (10, 128)}


@pytest.fixture(scope="module", params=["gemma2", "gemma3", "phi3"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, family):
    overrides = {"sliding_window": WINDOW} if family.startswith("gemma") else {}
    return build_tiny_model(tmp_path_factory.mktemp(family), family, **overrides)


@pytest.fixture(scope="module")
def prompts():
    # Shorter than the window, longer than it, and one sharing the other's first blocks;
    # with 64 new tokens all run past Phi-3's original 64 positions.
    long = [(7 * i) % 300 + 3 for i in range(45)]
    return [[7, 8, 9, 10, 11, 12], long, long[:40] + [5, 6]]


@pytest.fixture(scope="module")
def expected(model_dir, prompts):
    return hf_greedy(model_dir, prompts, MAX_NEW)


def _params():
    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def test_greedy_matches_transformers(family, model_dir, prompts, expected):
    assert all(len(set(tokens)) > 5 for tokens in expected)  # the model says something
    llm = LLM(str(model_dir), kv_cache_memory_gib=0.01)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, _params())]
    assert got == expected
    stats = llm.stats()
    assert sum(stats.block_ref_counts) == 0
    assert (stats.num_window_released_blocks > 0) == family.startswith("gemma")


def test_chunked_prefill_prefix_cache_and_preemption(family, model_dir, prompts, expected):
    num_blocks, max_model_len = SMALL_POOL[family]
    llm = LLM(str(model_dir), max_num_batched_tokens=7, num_gpu_blocks_override=num_blocks,
              max_model_len=max_model_len)
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, _params())]
    hits = llm.stats().prefix_cache_hits
    second = [o.outputs[0].token_ids for o in llm.generate(prompts, _params())]
    stats = llm.stats()
    assert first == second == expected
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hits > hits
    assert sum(stats.block_ref_counts) == 0
    assert stats.num_free_blocks == stats.num_blocks


def test_triton_backend_matches(family, model_dir, prompts, expected):
    """The Triton kernels (interpreted on CPU): GeGLU, soft-capped windowed attention, the
    partial LongRoPE rotation. Fewer tokens: the interpreter is slow."""
    llm = LLM(str(model_dir), attention_backend="triton", kv_cache_memory_gib=0.01,
              max_num_batched_tokens=16)
    params = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts[1:2], params)]
    assert got == [expected[1][:28]]  # 45 + 28 tokens: past the window and position 64


def test_tied_gemma_matches(tmp_path, prompts):
    model_dir = build_tiny_model(tmp_path, "gemma2", sliding_window=WINDOW, tie_word_embeddings=True)
    llm = LLM(str(model_dir), kv_cache_memory_gib=0.01)
    model = llm.engine.core.runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == hf_greedy(model_dir, prompts, 16)


def test_family_fields_read_from_config():
    base = {"vocab_size": 64, "hidden_size": 96, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 131072}
    # Phi-3 mini 128k's older file: `su`, the pretraining context outside rope_scaling.
    phi3 = model_config_from_dict({**base, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                                   "original_max_position_embeddings": 4096,
                                   "rope_scaling": {"type": "su", "short_factor": [1.0] * 12,
                                                    "long_factor": [2.0] * 12}})
    assert phi3.rope_scaling["rope_type"] == "longrope"
    assert phi3.long_rope_from == 4096 and phi3.rope_scaling["max_position_embeddings"] == 131072
    assert phi3.partial_rotary_factor == 1.0 and not phi3.tie_word_embeddings
    phi4 = model_config_from_dict({**base, "architectures": ["Phi3ForCausalLM"],
                                   "partial_rotary_factor": 0.75})
    assert phi4.partial_rotary_factor == 0.75 and phi4.long_rope_from is None
    # Gemma 3's older file: rope_local_base_freq beside rope_theta and rope_scaling; tied.
    gemma3 = model_config_from_dict({**base, "architectures": ["Gemma3ForCausalLM"],
                                     "model_type": "gemma3_text", "rope_theta": 1e6,
                                     "rope_local_base_freq": 1e4, "sliding_window": 512,
                                     "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert gemma3.rope_theta == 1e6 and gemma3.rope_scaling["factor"] == 8.0
    assert gemma3.local_rope == (1e4, None) and gemma3.tie_word_embeddings
