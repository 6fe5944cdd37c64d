"""Greedy generation through kvdeck equals Hugging Face transformers token for token."""

import pytest

from kvdeck import LLM, SamplingParams
from tests.model_factory import hf_greedy

MAX_NEW = 10
PROMPTS = [
    "The quick brown fox",
    "Paged attention stores keys and values in fixed-size blocks. Continuous batching",
    "Hi",
    "def add(a, b):\n    return a + b\n" * 3,
    "Prefix caching reuses blocks that hold the same tokens. " * 4,
]


@pytest.fixture(scope="module")
def references(tiny_model_dirs):
    refs = {}
    for family, path in tiny_model_dirs.items():
        llm = LLM(str(path), kv_cache_memory_gib=0.01)
        ids = [llm.get_tokenizer().encode(p) for p in PROMPTS]
        refs[family] = (ids, hf_greedy(path, ids, MAX_NEW))
    return refs


def _generate(path, ids, **config):
    llm = LLM(str(path), **config)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outputs = llm.generate(ids, params)
    stats = llm.stats()
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0 and stats.num_waiting == 0
    assert sum(stats.block_ref_counts) == 0
    return [o.outputs[0].token_ids for o in outputs], stats


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_transformers(tiny_model_dirs, references, family):
    ids, expected = references[family]
    got, _ = _generate(tiny_model_dirs[family], ids, kv_cache_memory_gib=0.01)
    assert got == expected


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_chunked_prefill_matches(tiny_model_dirs, references, family):
    ids, expected = references[family]
    got, stats = _generate(tiny_model_dirs[family], ids, max_num_batched_tokens=7,
                           kv_cache_memory_gib=0.01)
    assert got == expected
    assert stats.num_steps > len(ids) * MAX_NEW // 5  # far more steps than with a big budget


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_preemption_matches(tiny_model_dirs, references, family):
    ids, expected = references[family]
    longest = max(len(p) for p in ids) + MAX_NEW
    # A pool that holds one long request but not all of them at once.
    num_blocks = -(-longest // 16) + 3
    got, stats = _generate(tiny_model_dirs[family], ids, num_gpu_blocks_override=num_blocks,
                           max_model_len=num_blocks * 16)
    assert got == expected
    assert stats.num_preemptions > 0


def test_prefix_caching_off_matches(tiny_model_dirs, references):
    ids, expected = references["llama"]
    got, stats = _generate(tiny_model_dirs["llama"], ids, enable_prefix_caching=False,
                           kv_cache_memory_gib=0.01)
    assert got == expected
    assert stats.prefix_cache_hits == 0


def test_prefix_cache_hit_matches(tiny_model_dirs, references):
    """The same prompts twice: the second round is served mostly from the cache."""
    ids, expected = references["qwen2"]
    llm = LLM(str(tiny_model_dirs["qwen2"]), kv_cache_memory_gib=0.01)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    hits_before = llm.stats().prefix_cache_hits
    second = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    assert first == second == expected
    full_blocks = sum((len(p) - 1) // 16 for p in ids)
    assert llm.stats().prefix_cache_hits - hits_before >= full_blocks * 16
