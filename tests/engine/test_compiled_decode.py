"""Decode through torch.compile on CPU (`compile_decode`): the same greedy tokens as the
eager fp32 path (and so as transformers), bf16 within the stated tolerance of eager bf16,
one graph per batch-size bucket, each compiled once, and a failed compile leaves the
engine eager.

Only the fp32 test runs inductor itself (its C++ compile is ~40 s on two busy cores); the
others trace the same graphs with a backend of their own, which is where the bf16 packed
weights, the custom ops and the bucket handling could break."""

import logging

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner import compiled_forward
from kvdeck.engine.runner.models import native_decode
from tests.kernels.test_cpu_native import needs_kernel
from tests.model_factory import hf_greedy

PROMPTS = ["Hello there", "The quick brown fox", "Paged", "a b c d e f", "Blocks of keys",
           "Prefix caching", "def add(a, b):", "Héllo wörld", "x", "Continuous batching schedules",
           "keys and values", "lazy dog"]


def _greedy(llm: LLM, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.usefixtures("no_decoder_stack")  # the graphs take every decode step
def test_inductor_decode_matches_transformers(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_seqs=1, compile_decode=True)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(PROMPTS[1])]
    assert _greedy(llm, prompts, [6]) == hf_greedy(tiny_llama_dir, prompts, 6)
    assert llm.engine.core.runner.decode_graphs.checked == {1}  # compiled, checked, used


def test_bf16_compiled_within_tolerance_of_eager(tiny_llama_dir, monkeypatch):
    """bf16 (packed oneDNN weights where the CPU has bf16): each compiled graph is checked
    against the eager forward within 5e-2 of the largest hidden value (BF16_TOLERANCE), and
    the greedy tokens are eager bf16's. Without the native decoder stack, which would take
    these small steps (the next test)."""
    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    options = dict(kv_cache_memory_gib=0.01, max_num_seqs=2, dtype="bfloat16")
    eager = LLM(str(tiny_llama_dir), **options)
    compiled = LLM(str(tiny_llama_dir), compile_decode=True, **options)
    tok = eager.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    assert _greedy(compiled, prompts, [6, 6]) == _greedy(eager, prompts, [6, 6])
    assert compiled.engine.core.runner.decode_graphs.checked == {2}


@needs_kernel
def test_the_native_decoder_stack_takes_the_small_steps_first(tiny_llama_dir, monkeypatch):
    """Where the decoder stack takes a step (bf16 or fp32, at most 4 rows) it runs instead of
    the compiled graph, which it outruns (models/native_decode.py); the graphs keep the rest."""
    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", "aot_eager")
    options = dict(kv_cache_memory_gib=0.01, max_num_seqs=2, dtype="bfloat16")
    compiled = LLM(str(tiny_llama_dir), compile_decode=True, **options)
    runner = compiled.engine.core.runner
    assert runner.model.model.decoder_stack is not None
    tok = compiled.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    assert _greedy(compiled, prompts, [6, 6]) == _greedy(LLM(str(tiny_llama_dir), **options), prompts, [6, 6])
    assert runner.decode_graphs.checked == set()  # no graph was needed


@pytest.mark.usefixtures("no_decoder_stack")  # the graphs take every decode step
def test_a_graph_beyond_the_tolerance_leaves_the_engine_eager(tiny_llama_dir, monkeypatch, caplog):
    def off_by_a_bit(gm, example_inputs):
        def forward(*args):
            (hidden,) = gm.forward(*args)  # the forward's one output: the hidden states
            return (hidden + 0.1,)
        return forward

    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", off_by_a_bit)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_seqs=1, compile_decode=True)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(PROMPTS[2])]
    with caplog.at_level(logging.WARNING):
        assert _greedy(llm, prompts, [4]) == hf_greedy(tiny_llama_dir, prompts, 4)
    assert "differs from the eager forward" in caplog.text
    assert llm.engine.core.runner.decode_graphs.checked == set()


@pytest.mark.usefixtures("no_decoder_stack")  # the graphs take every decode step
def test_every_bucket_is_one_graph_compiled_once(tiny_llama_dir, monkeypatch):
    graphs: list[tuple] = []

    def counting_backend(gm, example_inputs):
        graphs.append(tuple(example_inputs[0].shape) if example_inputs else ())
        return gm.forward

    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", counting_backend)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_seqs=5, compile_decode=True)
    graphs_obj = llm.engine.core.runner.decode_graphs
    assert graphs_obj.sizes == [1, 2, 4, 5]
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:5]]
    lengths = [2, 3, 4, 5, 6]  # the batch shrinks by one row a step: every bucket runs
    got = _greedy(llm, prompts, lengths)
    assert got == [ref[:n] for ref, n in zip(hf_greedy(tiny_llama_dir, prompts, 6), lengths)]
    assert graphs_obj.checked == {1, 2, 4, 5}
    assert len(graphs) == 4  # one graph per bucket, none recompiled, none left to eager
    _greedy(llm, prompts, lengths)
    assert len(graphs) == 4  # and the second pass reuses them


@pytest.mark.usefixtures("no_decoder_stack")  # the graphs take every decode step
def test_a_failed_compile_leaves_the_engine_eager(tiny_llama_dir, monkeypatch, caplog):
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", broken_backend)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_seqs=2, compile_decode=True)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(PROMPTS[1])]
    with caplog.at_level(logging.WARNING):
        assert _greedy(llm, prompts, [5]) == hf_greedy(tiny_llama_dir, prompts, 5)
    assert "decode runs eagerly" in caplog.text
    assert not llm.engine.core.runner.decode_graphs.can_run(None, 1)


@pytest.mark.parametrize("options", [{}, {"compile_decode": True, "enforce_eager": True}])
def test_eager_is_the_default_and_enforce_eager_wins(tiny_llama_dir, options):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, **options)
    assert llm.engine.core.runner.decode_graphs is None
