"""Greedy suffix decoding emits exactly what non-speculative greedy decoding emits, on the tiny
float32 models, under chunked prefill, prefix caching and forced preemption. Each run asks
for the same prompts twice: the second round's outputs are the first's, which the global
tree holds, so long drafts of a length that varies per request are verified and accepted
(and a random model's own repeats give short ones that are rejected)."""

import pytest

from kvdeck import LLM, SamplingParams
from tests.engine.spec.test_spec_greedy import PROMPTS, _exercised, _generate

SUFFIX = {"speculative_config": {"method": "suffix", "num_speculative_tokens": 8,
                                 "suffix_decoding_max_spec_factor": 2.0}}


@pytest.fixture(scope="module")
def plain(tiny_model_dirs):
    return {family: _generate(path, {}, kv_cache_memory_gib=0.01)[0]
            for family, path in tiny_model_dirs.items()}


def _long_drafts(stats) -> None:
    """The second round's drafts came from the cached outputs: more than a few were accepted
    in one step (the per-position counters reach past the fourth draft)."""
    assert stats.spec.method == "suffix"
    assert stats.spec.num_accepted_tokens_per_pos[4] > 0, stats.spec


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_matches_non_speculative(tiny_model_dirs, plain, family):
    got, stats = _generate(tiny_model_dirs[family], SUFFIX, rounds=2, kv_cache_memory_gib=0.01)
    assert got == plain[family]
    _exercised(stats)
    _long_drafts(stats)


def test_chunked_prefill(tiny_model_dirs, plain):
    got, stats = _generate(tiny_model_dirs["qwen3"], SUFFIX, rounds=2, max_num_batched_tokens=9,
                           kv_cache_memory_gib=0.01)
    assert got == plain["qwen3"]
    _exercised(stats)
    _long_drafts(stats)


def test_forced_preemption(tiny_model_dirs, plain):
    num_blocks = 8  # holds one long request with its drafts, not all requests at once
    got, stats = _generate(tiny_model_dirs["llama"], SUFFIX, rounds=2,
                           num_gpu_blocks_override=num_blocks, max_model_len=num_blocks * 16)
    assert got == plain["llama"]
    assert stats.num_preemptions > 0
    _exercised(stats)
    _long_drafts(stats)


def test_resetting_the_prefix_cache_forgets_cached_outputs(tiny_model_dirs):
    """Benchmarks reset the prefix cache before each timed run: suffix decoding's cached
    outputs go with it, so no run drafts from an earlier run's outputs."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(str(tiny_model_dirs["llama"]), kv_cache_memory_gib=0.01, **SUFFIX) as llm:
        llm.generate(PROMPTS[:2], params)
        cache = llm.engine.core.spec.proposer.cache
        assert cache.global_tree.num_tokens == 16 and len(cache.cached) == 2
        llm.engine.reset_prefix_cache()
        assert cache.global_tree.num_tokens == 0 and not cache.cached


def test_prefix_cache_hits(tiny_model_dirs, plain):
    """The second round reuses cached blocks, which must hold only verified K/V."""
    got, stats = _generate(tiny_model_dirs["qwen2"], SUFFIX, rounds=2, kv_cache_memory_gib=0.01)
    assert got == plain["qwen2"]
    with LLM(str(tiny_model_dirs["qwen2"]), load_format="dummy") as llm:
        lengths = [len(llm.engine.frontend.encode(p)[1]) for p in PROMPTS]
    assert stats.prefix_cache_hits == sum((n - 1) // 16 * 16 for n in lengths)
    _long_drafts(stats)
