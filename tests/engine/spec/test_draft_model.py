"""The draft model: refused with another vocabulary, AWQ-quantised drafts work, its blocks
are in the stats snapshot, and it shares the KV memory with the target."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.app.cli import main as kvdeck
from kvdeck.engine.types.speculative import bundled_drafts
from tests.model_factory import build_tiny_model
from tests.quant.conftest import build_group128_llama


def test_a_draft_with_another_vocabulary_is_refused(tiny_model_dirs, tmp_path):
    from tests import model_factory

    other = tmp_path / "other"
    original = model_factory.build_tokenizer
    try:  # the same architecture, a smaller vocabulary
        model_factory.build_tokenizer = lambda out_dir: original(out_dir, vocab_size=300)
        build_tiny_model(other, "llama")
    finally:
        model_factory.build_tokenizer = original
    with pytest.raises(ValueError, match="draft's vocabulary has 300 tokens .* must share the target's"):
        LLM(str(tiny_model_dirs["llama"]), kv_cache_memory_gib=0.01,
            speculative_config={"model": str(other), "num_speculative_tokens": 2})


def test_the_demo_draft_for_another_model_is_refused_naming_both(tiny_model_dirs):
    target = str(tiny_model_dirs["llama"])  # a vocabulary of 400 tokens, the demo's has 4096
    with pytest.raises(ValueError) as refused:
        LLM(target, kv_cache_memory_gib=0.01,
            speculative_config={"model": "demo-draft", "num_speculative_tokens": 3})
    message = str(refused.value)
    assert (f"the draft demo-draft (the bundled demo model's draft) does not fit the target {target}: "
            "the draft's vocabulary has 4096 tokens") in message
    assert "the target's 400" in message and "must share the target's tokenizer" in message
    assert bundled_drafts(target) == () and bundled_drafts(None) == bundled_drafts("demo") == ("demo-draft",)


def test_awq_draft_gives_the_targets_greedy_output(tmp_path):
    target = build_group128_llama(tmp_path / "target")
    draft = tmp_path / "draft-awq"
    assert kvdeck(["quantize", str(target), "--method", "awq", "--out", str(draft), "--num-samples", "4",
                   "--seq-len", "64", "--device", "cpu"]) == 0
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 6, 7, 8], list(range(20, 60))]
    with LLM(str(target), max_model_len=128, kv_cache_memory_gib=0.01) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    config = {"model": str(draft), "num_speculative_tokens": 3}
    with LLM(str(target), max_model_len=128, kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        assert llm.engine.core.spec.proposer.runner.config.quantization == "awq"
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
        assert llm.stats().spec.num_accepted_tokens > 0


def test_draft_blocks_are_in_the_stats_and_the_pool_is_shared(tiny_model_dirs, tiny_draft_dirs):
    target = str(tiny_model_dirs["llama"])
    with LLM(target, kv_cache_memory_gib=0.01) as llm:
        alone = llm.engine.info.num_blocks
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3}
    with LLM(target, kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        # Same-size draft: the memory is split in two, one pool each, the same block count.
        assert llm.engine.info.num_blocks == alone // 2
        engine = llm.engine
        engine.add_request("r", "The quick brown fox", SamplingParams(temperature=0.0, max_tokens=20,
                                                                      ignore_eos=True))
        seen = False
        while engine.has_unfinished_requests():
            engine.step()
            stats = llm.stats()
            for request in stats.requests:
                spec = request.spec
                if spec.draft_block_table:
                    seen = True
                    assert all(stats.spec.draft_block_ref_counts[b] == 1 for b in spec.draft_block_table)
                    assert spec.draft_num_computed_tokens <= request.num_computed_tokens + 1
        assert seen
        stats = llm.stats()
        assert stats.spec.draft_num_blocks == stats.num_blocks
        assert sum(stats.spec.draft_block_ref_counts) == 0
