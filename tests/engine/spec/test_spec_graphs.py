"""Verify chunks are decode rows, so decode-only speculative steps take the decode-graph path
(its static buffers and padding, replayed eagerly here: `capture=False`), sized for k + 1
rows per speculating request; outputs stay those of plain greedy decoding."""

import pytest

from kvdeck import LLM, SamplingParams

PROMPTS = ["Hello there", "The quick brown fox", "Paged"]


# The graph machinery, not the native decoder stack, which would take the small steps first.
pytestmark = pytest.mark.usefixtures("no_decoder_stack")

def test_verify_steps_run_through_the_decode_graphs(tiny_model_dirs, tiny_draft_dirs):
    path = tiny_model_dirs["llama"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(str(path), kv_cache_memory_gib=0.01) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3}
    with LLM(str(path), kv_cache_memory_gib=0.01, max_num_seqs=4, speculative_config=config) as llm:
        core = llm.engine.core
        core.runner.capture_decode_graphs(core.max_model_len, capture=False, max_rows=16)
        graphs = core.runner.decode_graphs
        assert graphs is not None and graphs.max_batch_size == 16  # 4 requests x (1 + 3) rows
        rows: list[int] = []
        original = graphs.run
        graphs.run = lambda ids, pos, meta: (rows.append(ids.shape[0]), original(ids, pos, meta))[1]
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        assert got == plain
        assert max(rows) > len(PROMPTS)  # verify chunks: more rows than requests, replayed
        assert llm.stats().spec.num_accepted_tokens > 0


def test_draft_decodes_run_through_the_draft_runners_decode_graphs(tiny_model_dirs, tiny_draft_dirs):
    """Drafts 2..k are one-token forwards: the draft's own runner serves them from its graphs."""
    path = tiny_model_dirs["llama"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(str(path), kv_cache_memory_gib=0.01) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3}
    with LLM(str(path), kv_cache_memory_gib=0.01, max_num_seqs=4, speculative_config=config) as llm:
        core = llm.engine.core
        draft_runner = core.spec.proposer.runner
        draft_runner.capture_decode_graphs(core.max_model_len, capture=False)
        graphs = draft_runner.decode_graphs
        assert graphs is not None
        replays: list[int] = []
        original = graphs.run
        graphs.run = lambda ids, pos, meta: (replays.append(ids.shape[0]), original(ids, pos, meta))[1]
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        assert got == plain
        assert replays and max(replays) <= len(PROMPTS)  # one row per speculating request
