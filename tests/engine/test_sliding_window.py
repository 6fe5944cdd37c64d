"""Sliding-window models attend over their window in the paged kernels, release the blocks
that slid out of it, and are not capped at the window: greedy output equals transformers'
well past the window, with chunked prefill, prefix caching and preemption."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.core.request import NO_BLOCK
from kvdeck.engine.types.model_config import model_config_from_dict
from tests.model_factory import build_tiny_model, hf_greedy

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4}
WINDOW = 20  # not a multiple of the block size: the window's edge falls inside a block
MAX_NEW = 64


@pytest.mark.parametrize("fields, window, layer_windows", [
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, 4096, [4096] * 4),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": None}, None, [None] * 4),
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": False},
     None, [None] * 4),
    # Qwen2's layers from max_window_layers on use the window: none here, two here.
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "use_sliding_window": True,
      "max_window_layers": 4}, None, [None] * 4),
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 512, "use_sliding_window": True,
      "max_window_layers": 2}, 512, [None, None, 512, 512]),
    ({"architectures": ["Qwen3ForCausalLM"], "sliding_window": 256,
      "layer_types": ["full_attention"] * 4}, None, [None] * 4),
    ({"architectures": ["Qwen3ForCausalLM"], "sliding_window": 256,
      "layer_types": ["sliding_attention", "full_attention"] * 2}, 256, [256, None] * 2),
    # Older Gemma configs without layer_types: Gemma 2 alternates, Gemma 3 has a pattern.
    ({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "sliding_window": 64},
     64, [64, None] * 2),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "sliding_window": 64,
      "sliding_window_pattern": 2}, 64, [64, None] * 2),
])
def test_windows_read_from_config(fields, window, layer_windows):
    config = model_config_from_dict({**BASE, **fields})
    assert config.sliding_window == window
    assert config.layer_windows == layer_windows


def test_unknown_layer_types_are_refused():
    with pytest.raises(ValueError, match="chunked_attention"):
        model_config_from_dict({**BASE, "architectures": ["LlamaForCausalLM"],
                                "layer_types": ["chunked_attention"] * 4})


@pytest.fixture(scope="module")
def windowed_mistral(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("mistral_window"), "mistral",
                            sliding_window=WINDOW)


@pytest.fixture(scope="module")
def prompts():
    # Shorter than the window, longer than it, and one sharing the other's first blocks.
    long = [(7 * i) % 300 + 3 for i in range(45)]
    return [[7, 8, 9, 10, 11, 12], long, long[:40] + [5, 6]]


@pytest.fixture(scope="module")
def expected(windowed_mistral, prompts):
    return hf_greedy(windowed_mistral, prompts, MAX_NEW)


def _generate(model_dir, prompts, **config):
    llm = LLM(str(model_dir), **config)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    return llm, got


def test_max_model_len_is_not_capped_at_the_window(windowed_mistral):
    llm = LLM(str(windowed_mistral), kv_cache_memory_gib=0.01)
    assert llm.engine.max_model_len == 512  # max_position_embeddings, not the window
    # A pool smaller than one long request still serves it: only the window is held.
    small = LLM(str(windowed_mistral), num_gpu_blocks_override=6, max_model_len=512,
                max_num_batched_tokens=16)
    assert small.engine.max_model_len == 512


def test_greedy_past_the_window_matches_transformers(windowed_mistral, prompts, expected):
    llm, got = _generate(windowed_mistral, prompts, kv_cache_memory_gib=0.01)
    assert got == expected
    stats = llm.stats()
    assert stats.num_window_released_blocks > 0
    assert sum(stats.block_ref_counts) == 0


def test_chunked_prefill_prefix_cache_and_preemption(windowed_mistral, prompts, expected):
    # Chunks of 7 tokens, a pool too small for all three at once, the prompts twice (the
    # second round from the prefix cache: a window's blocks suffice for a hit).
    llm = LLM(str(windowed_mistral), max_num_batched_tokens=7, num_gpu_blocks_override=6,
              max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    hits = llm.stats().prefix_cache_hits
    second = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    stats = llm.stats()
    assert first == second == expected
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hits > hits
    assert sum(stats.block_ref_counts) == 0


def test_block_map_shows_the_window_releasing_blocks(windowed_mistral):
    """A long generation on the windowed model: the request holds a window's worth of
    blocks whatever its length, its table's released entries are -1 in the snapshot, and
    the released blocks serve its later positions."""
    llm = LLM(str(windowed_mistral), num_gpu_blocks_override=8, max_model_len=400,
              max_num_batched_tokens=16)
    engine = llm.engine
    engine.add_request("long", [3, 4, 5], SamplingParams(temperature=0.0, max_tokens=200,
                                                         ignore_eos=True))
    held, seen_blocks = [], set()
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        for request in stats.requests:
            live = [b for b in request.block_table if b != NO_BLOCK]
            held.append(len(live))
            seen_blocks.update(live)
            assert sum(stats.block_ref_counts) == len(live)  # the snapshot agrees with the table
            assert all(b == NO_BLOCK for b in request.block_table[: -len(live)])
    stats = engine.stats()
    needed = -(-203 // stats.block_size)
    assert max(held) <= -(-(WINDOW - 1) // stats.block_size) + 2
    assert stats.num_window_released_blocks >= needed - max(held)
    assert len(seen_blocks) <= stats.num_blocks < needed  # blocks came back and were reused
    assert stats.num_free_blocks == stats.num_blocks
