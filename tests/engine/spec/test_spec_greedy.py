"""Greedy speculative decoding emits exactly what non-speculative greedy decoding emits, with
either proposer, on every family's tiny model, under chunked prefill, prefix caching and
forced preemption; and nothing leaks in either KV pool."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.linear import bf16_packing_supported

MAX_NEW = 24
PROMPTS = [
    "The quick brown fox",
    "Paged attention stores keys and values in fixed-size blocks. Continuous batching",
    "Hi",
    "def add(a, b):\n    return a + b\n" * 3,
    "Prefix caching reuses blocks that hold the same tokens. " * 4,
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _draft(path) -> dict:
    return {"model": str(path), "num_speculative_tokens": 3}


def _generate(path, config: dict, prompts=PROMPTS, rounds: int = 1, **engine):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    with LLM(str(path), **engine, **config) as llm:
        for _ in range(rounds):
            outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        stats = llm.stats()
    assert stats.kv_cache_usage == 0.0 and sum(stats.block_ref_counts) == 0
    if stats.spec is not None:
        assert sum(stats.spec.draft_block_ref_counts) == 0, "the draft's pool leaked"
    return outputs, stats


@pytest.fixture(scope="module")
def plain(tiny_model_dirs):
    """Non-speculative greedy outputs per family (a big pool, one chunk per prompt)."""
    return {family: _generate(path, {}, kv_cache_memory_gib=0.01)[0]
            for family, path in tiny_model_dirs.items()}


def _exercised(stats, accepted: bool = True) -> None:
    """Drafts were verified, some rejected and (unless the model never repeats itself in a way
    an n-gram lookup finds) some accepted."""
    spec = stats.spec
    assert spec.num_drafts > 0 and spec.num_accepted_tokens < spec.num_draft_tokens, spec
    assert spec.num_accepted_tokens > 0 or not accepted, spec


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_greedy_matches_non_speculative(tiny_model_dirs, tiny_draft_dirs, plain, family, proposer):
    config = NGRAM if proposer == "ngram" else _draft(tiny_draft_dirs[family])
    got, stats = _generate(tiny_model_dirs[family], {"speculative_config": config},
                           kv_cache_memory_gib=0.01)
    assert got == plain[family]
    # Random tiny models rarely repeat themselves: an n-gram lookup may never be right.
    _exercised(stats, accepted=proposer == "draft")


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_chunked_prefill(tiny_model_dirs, tiny_draft_dirs, plain, proposer):
    config = NGRAM if proposer == "ngram" else _draft(tiny_draft_dirs["qwen3"])
    got, stats = _generate(tiny_model_dirs["qwen3"], {"speculative_config": config},
                           max_num_batched_tokens=9, kv_cache_memory_gib=0.01)
    assert got == plain["qwen3"]
    _exercised(stats)


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_forced_preemption(tiny_model_dirs, tiny_draft_dirs, plain, proposer):
    config = NGRAM if proposer == "ngram" else _draft(tiny_draft_dirs["llama"])
    # A pool that holds one long request with its drafts, but not all requests at once.
    num_blocks = 8
    got, stats = _generate(tiny_model_dirs["llama"], {"speculative_config": config},
                           num_gpu_blocks_override=num_blocks, max_model_len=num_blocks * 16)
    assert got == plain["llama"]
    assert stats.num_preemptions > 0
    _exercised(stats)


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_prefix_cache_hits(tiny_model_dirs, tiny_draft_dirs, plain, proposer):
    """The same prompts twice: the second round reuses cached blocks, which must hold only
    verified K/V, and still decodes the same tokens."""
    config = NGRAM if proposer == "ngram" else _draft(tiny_draft_dirs["qwen2"])
    got, stats = _generate(tiny_model_dirs["qwen2"], {"speculative_config": config}, rounds=2,
                           kv_cache_memory_gib=0.01)
    assert got == plain["qwen2"]
    with LLM(str(tiny_model_dirs["qwen2"]), load_format="dummy") as llm:
        lengths = [len(llm.engine.frontend.encode(p)[1]) for p in PROMPTS]
    assert stats.prefix_cache_hits == sum((n - 1) // 16 * 16 for n in lengths)  # every full block
    _exercised(stats, accepted=proposer == "draft")


def test_batch_size_threshold_turns_speculation_off(tiny_model_dirs, tiny_draft_dirs):
    """Over disable_by_batch_size running requests no step carries drafts; once the batch
    shrinks to the threshold, speculation resumes."""
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3,
              "disable_by_batch_size": 2}
    lengths = [4, 8, 12, 40, 40]  # three finish early, two go on
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    with LLM(str(tiny_model_dirs["llama"]), kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        engine = llm.engine
        for prompt, p in zip(PROMPTS, params):
            engine.add_request(None, prompt, p)
        seen = []
        while engine.has_unfinished_requests():
            running = len(engine.core.scheduler.running)
            engine.step()
            spec = llm.stats().spec
            seen.append((running, spec.last_step_disabled, spec.last_step_draft_tokens))
    assert all(disabled and drafts == 0 for running, disabled, drafts in seen if running > 2)
    assert any(drafts > 0 for running, disabled, drafts in seen if running <= 2)



@pytest.fixture(scope="module")
def smollm2_shaped_dir(tmp_path_factory):
    """A random llama of SmolLM2-135M's widths (576 hidden, 1536 intermediate, 9 heads over 3
    kv heads of 64) and four of its thirty layers: sums as long as the real model's, whose
    order shows in bf16 where a tiny model's 64-wide sums round alike either way."""
    from tests.model_factory import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("smollm2_shaped") / "llama", "llama", hidden_size=576,
                            intermediate_size=1536, num_hidden_layers=4, num_attention_heads=9,
                            num_key_value_heads=3, initializer_range=0.04)


@pytest.mark.skipif(not (cpu_native.available() and bf16_packing_supported()),
                    reason="needs the native CPU kernels and a CPU with bf16")
def test_bfloat16_greedy_is_plain_greedy_bit_for_bit(smollm2_shaped_dir):
    """In bf16 (the CPU's default dtype where it has bf16) a verify step of k + 1 rows takes a
    one-row decode step's kernels (the decoder stack, the output head's GEMV), so a chat's
    speculative greedy output is its plain greedy output: with five drafts, six rows, past the
    four at which the Python forward's oneDNN and SDPA would take the step and round
    differently. Every token speculation emits comes from a verify row, accepted or not."""
    config = {**NGRAM, "num_speculative_tokens": 5}
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)

    def one_request_at_a_time(**engine) -> tuple[list[list[int]], object]:
        with LLM(str(smollm2_shaped_dir), dtype="bfloat16", kv_cache_memory_gib=0.05, **engine) as llm:
            outputs = [llm.generate([prompt], params)[0].outputs[0].token_ids for prompt in PROMPTS]
            return outputs, llm.stats()

    plain_outputs, _ = one_request_at_a_time()
    spec_outputs, stats = one_request_at_a_time(speculative_config=config)
    assert stats.spec.num_drafts > 0
    assert spec_outputs == plain_outputs
