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


def test_no_kernel_compiles_while_serving_after_the_warm_up(tiny_model_dirs):
    """The start-up warm-up (run on CUDA; called here by hand) launches every variant the
    Triton kernels need: batches of any size, chunked prefills and decode then compile none
    (the interpreter's counter works out each launch's specialisation as Triton would)."""
    from kvdeck.kernels.compile_counter import kernel_compiles

    llm = LLM(str(tiny_model_dirs["qwen3"]), attention_backend="triton", kv_cache_memory_gib=0.01,
              max_num_batched_tokens=64, max_model_len=512)
    runner = llm.engine.core.runner
    runner.warm_up(llm.engine.max_model_len)
    assert runner.kernel_compiles() == kernel_compiles()
    before = kernel_compiles()
    for batch, prompt_len, out_len in ((1, 3, 4), (3, 17, 3), (5, 70, 2), (2, 33, 5)):
        prompts = [[(7 * i + j) % 200 + 5 for j in range(prompt_len + i)] for i in range(batch)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    assert kernel_compiles() == before
    assert llm.stats().kernel_compiles_total == kernel_compiles()
