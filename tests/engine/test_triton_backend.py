"""End to end through the Triton kernels (TRITON_INTERPRET=1 on CPU, set in conftest):
greedy output equals transformers, with chunked prefill and a prefix-cache hit."""

import os

import pytest

from kvdeck import LLM, SamplingParams
from tests.model_factory import hf_greedy

PREFIX = "Paged attention stores keys and values in fixed-size blocks. "


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_triton_backend_matches_transformers(tiny_model_dirs, family):
    assert os.environ.get("TRITON_INTERPRET") == "1"
    path = tiny_model_dirs[family]
    llm = LLM(str(path), attention_backend="triton", kv_cache_memory_gib=0.01,
              max_num_batched_tokens=16)
    assert llm.engine.core.runner.ops.name == "triton"
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in (PREFIX * 2 + "Hello", PREFIX * 2 + "The quick", "Hi")]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate(ids[:1], params)  # fills the prefix cache
    rest = llm.generate(ids[1:], params)
    stats = llm.stats()
    assert stats.prefix_cache_hits >= 16  # the shared prefix was served from the cache
    assert stats.num_steps > 8  # a 16-token budget forced chunked prefill
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == hf_greedy(path, ids, 6)
