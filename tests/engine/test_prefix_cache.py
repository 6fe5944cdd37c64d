"""Two requests sharing a 4-block prefix: the second reuses the blocks, same output."""

from kvdeck import LLM, SamplingParams


def test_shared_prefix_hits_and_output_unchanged(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    prefix = list(range(10, 10 + 64))  # exactly 4 blocks of 16
    first, second = prefix + [200, 201, 202], prefix + [300, 301]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([first], params)
    before = llm.stats()
    out = llm.generate([second], params)[0]
    after = llm.stats()
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 4 * 16
    assert out.num_cached_tokens >= 64
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(second)

    uncached = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, enable_prefix_caching=False)
    expected = uncached.generate([second], params)[0]
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids


def test_running_requests_share_blocks(tiny_llama_dir):
    """While both run, the shared prefix blocks have a reference count of 2."""
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    engine = llm.engine
    prefix = list(range(20, 20 + 48))
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("a", prefix + [5], params)
    engine.step()  # a's prompt computed, its full blocks cached
    engine.add_request("b", prefix + [6, 7], params)
    engine.step()
    stats = engine.stats()
    tables = {r.request_id: r.block_table for r in stats.requests}
    shared = tables["a"][:3]
    assert tables["b"][:3] == shared
    assert all(stats.block_ref_counts[b] == 2 for b in shared)
    engine.abort_request(["a", "b"])
    stats = engine.stats()
    assert stats.kv_cache_usage == 0 and stats.num_cached_blocks >= 3
