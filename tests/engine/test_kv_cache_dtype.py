"""8-bit KV caches on the bundled demo model: the pool holds twice the blocks of a 16-bit
cache in the same memory, and greedy decoding stays with the 32-bit cache's for a while.

Agreement is the mean, over the prompts, of the share of the 128 tokens generated before
the first one that differs from the 32-bit cache's. The demo model is tiny and its next-token
distributions flat, so an 8-bit cache moves the greedy path sooner than on a real model;
the floors sit below what this model measures (int8 0.81, fp8_e5m2 0.37, fp8_e4m3 0.27 over
eight prompts; docs/guide/engine-options.md) and far above what a broken dequantisation gives
(divergence within a few tokens)."""

import pytest

from kvdeck import LLM, SamplingParams

PROMPTS = ["Return a", "The json module", "def open(file, mode='r'):\n    \"\"\"",
           "Read the file and", "class Path:", "import os\n", "Parse the arguments",
           "The quick brown fox"]
NUM_TOKENS = 128
AGREEMENT_FLOOR = {"int8": 0.6, "fp8_e4m3": 0.15, "fp8_e5m2": 0.2}
MEMORY_GIB = 0.02


def _greedy(kv_cache_dtype: str) -> tuple[list[list[int]], LLM]:
    llm = LLM(kv_cache_memory_gib=MEMORY_GIB, kv_cache_dtype=kv_cache_dtype)
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = llm.generate([tok.encode(p) for p in PROMPTS], params)
    return [o.outputs[0].token_ids for o in outputs], llm


def _agreement(got: list[list[int]], reference: list[list[int]]) -> float:
    prefixes = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), NUM_TOKENS)
                for x, y in zip(got, reference)]
    return sum(prefixes) / (NUM_TOKENS * len(prefixes))


@pytest.fixture(scope="module")
def reference():
    tokens, llm = _greedy("auto")  # the demo model runs in fp32 on CPU: a 32-bit cache
    assert llm.engine.core.runner.kv_pool.format.name == "float32"
    return tokens


@pytest.mark.parametrize("kv_cache_dtype", list(AGREEMENT_FLOOR))
def test_greedy_agreement_with_the_32_bit_cache(reference, kv_cache_dtype):
    tokens, llm = _greedy(kv_cache_dtype)
    assert llm.engine.core.runner.kv_pool.format.name == kv_cache_dtype
    assert sum(llm.stats().block_ref_counts) == 0
    agreement = _agreement(tokens, reference)
    assert agreement >= AGREEMENT_FLOOR[kv_cache_dtype], agreement
    assert agreement < 1.0 or kv_cache_dtype == "int8"  # fp8 really is stored in 8 bits


def test_the_pool_holds_twice_the_blocks():
    def num_blocks(kv_cache_dtype: str) -> tuple[int, int]:
        llm = LLM(kv_cache_memory_gib=MEMORY_GIB, kv_cache_dtype=kv_cache_dtype)
        return llm.stats().num_blocks, llm.engine.core.runner.bytes_per_block

    blocks16, bytes16 = num_blocks("float16")
    blocks32, _ = num_blocks("auto")
    assert blocks16 // 2 == blocks32
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        blocks, size = num_blocks(fp8)
        assert size * 2 == bytes16 and blocks in (2 * blocks16, 2 * blocks16 + 1)
    # int8 keeps an fp16 scale per (token, head) beside head_dim bytes: 2 * 64 / (64 + 2).
    blocks, size = num_blocks("int8")
    assert size * 2 * 64 == bytes16 * (64 + 2) and blocks >= int(1.93 * blocks16)
