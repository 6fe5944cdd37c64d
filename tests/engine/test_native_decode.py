"""bf16 and fp32 decode steps through the native decoder stack
(engine/runner/models/native_decode.py): the same greedy tokens as the model's Python
forward for every Llama-family model, bound only where it applies, and let go with the KV
cache."""

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.models import native_decode
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.decode_stack import DecoderStack
from tests.kernels.test_cpu_native import needs_kernel
from tests.model_factory import build_tiny_model

pytestmark = needs_kernel

# Past a block edge and past Phi-3's original 64 positions; one prompt shares another's start.
LONG = [(7 * i) % 300 + 3 for i in range(45)]
PROMPTS = [[7, 8, 9, 10, 11, 12], LONG, LONG[:40]]


def _generate(llm: LLM, prompts: list[list[int]] = PROMPTS, max_tokens: int = 40) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _stack(llm: LLM) -> DecoderStack | None:
    return llm.engine.core.runner.model.model.decoder_stack


@pytest.mark.parametrize("dtype,kv_cache_dtype", [("bfloat16", "auto"), ("float32", "auto"),
                                                  ("float32", "float16")])  # fp16: llama.cpp's cache
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "phi3"])
def test_the_same_tokens_as_the_python_forward(tmp_path, monkeypatch, family, dtype, kv_cache_dtype):
    model_dir = build_tiny_model(tmp_path / family, family)
    options = dict(dtype=dtype, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_gib=0.01, max_num_seqs=3,
                   max_num_batched_tokens=32, enable_prefix_caching=True)  # chunked prefills, a shared prefix
    calls = []
    run = DecoderStack.run
    monkeypatch.setattr(DecoderStack, "run", lambda self, *a: calls.append(a[0].shape[0]) or run(self, *a))
    native = LLM(str(model_dir), **options)
    assert _stack(native) is not None and _stack(native).dtype == getattr(torch, dtype)
    native_tokens = _generate(native)
    # decode steps went native (and in fp32 the prefill chunks of up to 32 tokens too)
    assert 3 in calls and max(calls) <= _stack(native).max_rows
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    python = LLM(str(model_dir), **options)
    assert _stack(python) is None
    assert native_tokens == _generate(python)


def test_fp32_batches_past_eight_rows_take_the_stack_and_keep_the_tokens(tiny_llama_dir, monkeypatch):
    """A small fp32 model (its weights in the last-level cache) takes every step through the
    stack, in passes of FP32_CACHED_MAX_ROWS tokens: a dozen decoding requests, and the
    first step's twelve prompts (126 tokens), with the per-layer forward's greedy tokens."""
    prompts = [[(7 * i + j) % 300 + 3 for i in range(5 + j)] for j in range(12)]
    options = dict(kv_cache_memory_gib=0.01, max_num_seqs=12)
    rows = []
    run = DecoderStack.run
    monkeypatch.setattr(DecoderStack, "run", lambda self, *a: rows.append(a[0].shape[0]) or run(self, *a))
    native = LLM(str(tiny_llama_dir), **options)
    assert _stack(native).max_rows == native_decode.FP32_CACHED_MAX_ROWS and _stack(native).in_passes
    native_tokens = _generate(native, prompts, max_tokens=24)
    assert 12 in rows and max(rows) == 126  # the prompts' step, past the 64 of a pass
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    assert native_tokens == _generate(LLM(str(tiny_llama_dir), **options), prompts, max_tokens=24)


def test_the_row_limit_follows_the_dtype_and_the_cache(tiny_llama_dir, monkeypatch):
    layers = _stack(LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)).layers
    assert native_decode.stack_max_rows(layers) == native_decode.FP32_CACHED_MAX_ROWS
    assert native_decode.stack_in_passes(layers)  # any step, in passes read from the cache
    monkeypatch.setattr(cpu_native, "last_level_cache_bytes", lambda: 1024)  # weights past the cache
    assert native_decode.stack_max_rows(layers) == cpu_native.F32_GEMV_MAX_ROWS  # one pass of the GEMV
    assert not native_decode.stack_in_passes(layers)
    bf16 = _stack(LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory_gib=0.01)).layers
    assert native_decode.stack_max_rows(bf16) == cpu_native.BF16_STACK_MAX_ROWS
    assert not native_decode.stack_in_passes(bf16)


def test_preemption_and_a_small_pool_keep_the_python_forwards_tokens(tmp_path, monkeypatch):
    """Phi-3 (partial LongRoPE rotation, past its original 64 positions) in a pool too small
    for three requests at once: preempted requests recompute, every block comes back. The
    budget keeps each recompute one chunk of more than 4 tokens, so both runs prefill on
    SDPA (a chunk of at most 4 tokens would run native on one side, with other roundings)."""
    model_dir = build_tiny_model(tmp_path / "phi3", "phi3")
    options = dict(dtype="bfloat16", num_gpu_blocks_override=10, max_model_len=128, max_num_seqs=3,
                   max_num_batched_tokens=256)
    native = LLM(str(model_dir), **options)
    assert _stack(native) is not None
    native_tokens = _generate(native, max_tokens=64)
    stats = native.stats()
    assert stats.num_preemptions > 0
    assert sum(stats.block_ref_counts) == 0 and stats.num_free_blocks == stats.num_blocks
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    assert native_tokens == _generate(LLM(str(model_dir), **options), max_tokens=64)


def test_bound_only_where_it_applies(tiny_llama_dir, tmp_path):
    assert _stack(LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)).dtype == torch.float32  # the default
    assert _stack(LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, quantization="int8")) is None  # int8
    assert _stack(LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype="int8",
                      kv_cache_memory_gib=0.01)) is None  # an 8-bit cache's scales
    gemma = build_tiny_model(tmp_path / "gemma2", "gemma2", sliding_window=20)
    llm = LLM(str(gemma), dtype="bfloat16", kv_cache_memory_gib=0.01)
    assert not hasattr(llm.engine.core.runner.model.model, "decoder_stack")  # not a Llama decoder
    mistral = build_tiny_model(tmp_path / "mistral", "mistral", sliding_window=8)
    assert _stack(LLM(str(mistral), dtype="bfloat16", kv_cache_memory_gib=0.01)) is None  # a window


def test_let_go_with_the_kv_cache(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory_gib=0.01)
    runner = llm.engine.core.runner
    assert _stack(llm) is not None
    runner.release_kv_cache()
    assert runner.model.model.decoder_stack is None  # it held the freed caches' addresses
    runner.allocate_kv_cache(runner.num_blocks)
    assert _stack(llm) is not None and _stack(llm).layers[0].k_cache.data_ptr() == (
        runner.attention_layers[0].k_cache.data_ptr())


def test_speculative_verification_through_the_stack_keeps_plain_decodings_tokens(tiny_llama_dir, monkeypatch):
    """A verify step (the last token and its drafts, a chunk of up to four tokens) runs
    native too, one row a token; rows never mix in the stack, so greedy speculative output
    is plain bf16 decoding's token for token."""
    options = dict(dtype="bfloat16", kv_cache_memory_gib=0.01, max_num_seqs=1)
    prompts = [[5, 6, 7, 8, 9] * 6, [11, 12, 13] * 10]  # repetitive: the n-gram proposer drafts
    plain = _generate(LLM(str(tiny_llama_dir), **options), prompts)
    chunks = []
    run = DecoderStack.run
    monkeypatch.setattr(DecoderStack, "run", lambda self, *a: chunks.append(a[0].shape[0]) or run(self, *a))
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    speculative = LLM(str(tiny_llama_dir), speculative_config=config, **options)
    assert _generate(speculative, prompts) == plain
    assert 4 in chunks  # verify steps of the last token and three drafts went native


def test_the_engine_says_what_it_fell_back_from(tiny_llama_dir):
    """EngineInfo.fallbacks: no GPU (device auto on a CPU machine), and why the CPU decoder
    stack does not take a model's decode steps; nothing where nothing fell back."""
    auto = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01).engine.info.fallbacks
    assert auto[0].startswith("no CUDA GPU found: running on the CPU") and len(auto) == 1
    assert LLM(str(tiny_llama_dir), device="cpu", kv_cache_memory_gib=0.01).engine.info.fallbacks == []
    int8 = LLM(str(tiny_llama_dir), device="cpu", quantization="int8",
               kv_cache_memory_gib=0.01).engine.info.fallbacks
    assert len(int8) == 1 and int8[0].startswith("decode steps run the Python forward, not the "
                                                 "native CPU decoder stack: a projection has")
