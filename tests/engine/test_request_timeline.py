"""Per-request timelines: the events in order for a chunked prefill, a prefix-cache hit, a
preemption and speculative decoding; TTFT in parts; the reason line of a waiting request."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.request_timeline import DECODE, FINISHED, PREEMPTED, PREFILL, QUEUED

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _run(engine) -> dict:
    """Step until done; each request's final output."""
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return finished


def _phases(timeline) -> list[str]:
    return [phase for _, phase in timeline.phases]


def test_chunked_prefill_events_in_order_and_ttft_parts(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_batched_tokens=16)
    engine = llm.engine
    engine.add_request("long", list(range(10, 10 + 40)), GREEDY)  # 40 tokens: chunks 16, 16, 8
    output = _run(engine)["long"]
    timeline = output.metrics.timeline
    assert _phases(timeline) == [QUEUED, PREFILL, DECODE, FINISHED]
    assert [tokens for _, tokens, _ in timeline.prefill_chunks] == [16, 16, 8]
    steps = [step for step, _, _ in timeline.prefill_chunks]
    assert steps == sorted(steps) and len(set(steps)) == 3
    # Five decode steps right after the last chunk (its step sampled the first token).
    assert timeline.decode_runs == [(steps[-1] + 1, steps[-1] + 5, 5)]
    assert timeline.finish_reason == "length" and not timeline.preemptions
    times = [t for t, _ in timeline.phases]
    assert times == sorted(times)
    ttft = timeline.ttft
    assert ttft.queue_s >= 0 and ttft.prefill_s > 0 and ttft.first_step_s > 0
    decode_started = timeline.phases[2][0]
    assert ttft.total_s == pytest.approx(decode_started - timeline.queued_at, abs=1e-9)
    assert ttft.total_s == pytest.approx(output.metrics.time_to_first_token, abs=0.02)


def test_prefix_cache_hit_counts_cached_tokens(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    prefix = list(range(10, 10 + 64))  # 4 blocks of 16
    llm.generate([prefix + [200, 201]], GREEDY)
    second = llm.generate([prefix + [300, 301]], GREEDY)[0]
    (step, tokens, cached), = second.metrics.timeline.prefill_chunks
    assert cached == 64 and tokens == 2


def test_preempted_request_records_who_needed_the_blocks(tiny_llama_dir):
    # Room for two 3-block prompts and nothing more: the older's fourth block is the newer's.
    llm = LLM(str(tiny_llama_dir), num_gpu_blocks_override=6, max_model_len=6 * 16,
              enable_prefix_caching=False, preemption_mode="recompute")  # swap: test_swap_preemption.py
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("old", list(range(10, 10 + 40)), params)
    engine.add_request("new", list(range(100, 100 + 40)), params)
    reasons = []
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        reasons += [r.reason for r in engine.stats().requests if r.request_id == "new"]
    timeline = finished["new"].metrics.timeline
    assert timeline.preemptions and all(by == "old" for _, _, by in timeline.preemptions)
    phases = _phases(timeline)
    assert phases[:4] == [QUEUED, PREFILL, DECODE, PREEMPTED]
    assert phases[4] == PREFILL and phases[-1] == FINISHED  # recomputed, then finished
    # A decode run ended at the preemption; one more after the recompute.
    assert len(timeline.decode_runs) == len(timeline.preemptions) + 1
    assert sum(tokens for *_, tokens in timeline.decode_runs) + len(timeline.preemptions) + 1 == 40
    assert any(r.startswith("preempted once (for old); waiting: needs") for r in reasons), reasons
    assert not finished["old"].metrics.timeline.preemptions


def test_reason_line_of_a_request_the_pool_cannot_take(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), num_gpu_blocks_override=6, max_model_len=6 * 16,
              enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("big", list(range(10, 10 + 64)), params)  # holds 4 blocks, then 5
    engine.add_request("next", list(range(100, 100 + 40)), params)  # needs 3
    engine.step()
    by_id = {r.request_id: r for r in engine.stats().requests}
    assert by_id["next"].reason == "waiting: needs 3 blocks, 2 free"
    assert by_id["next"].timeline.phases == [(by_id["next"].timeline.queued_at, QUEUED)]
    assert by_id["big"].reason == "decoding: 1 token out"
    engine.add_request("third", list(range(200, 200 + 40)), params)
    by_id = {r.request_id: r for r in engine.stats().requests}
    assert by_id["third"].reason == "waiting: needs 3 blocks, 2 free; 1 request ahead"
    _run(engine)


def test_speculative_request_counts_verify_steps(tiny_llama_dir):
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
             "prompt_lookup_max": 3}
    prompt = "def add(a, b):\n    return a + b\n" * 3
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, speculative_config=ngram) as llm:
        output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    timeline = output.metrics.timeline
    assert _phases(timeline) == [QUEUED, PREFILL, DECODE, FINISHED]
    assert timeline.spec_verify_steps > 0 and timeline.spec_drafted >= timeline.spec_verify_steps
    assert 0 <= timeline.spec_accepted <= timeline.spec_drafted
    # Tokens of the decode runs: everything but the prefill's first token.
    assert sum(tokens for *_, tokens in timeline.decode_runs) == 23


def test_the_stats_stream_form_keeps_timeline_and_reason(tiny_llama_dir):
    import json

    from kvdeck.engine.types.stats import stats_from_dict, stats_to_dict

    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_batched_tokens=16)
    engine = llm.engine
    engine.add_request("a", list(range(10, 10 + 40)), GREEDY)
    engine.step()
    stats = engine.stats()
    back = stats_from_dict(json.loads(json.dumps(stats_to_dict(stats))))
    (before,), (after,) = stats.requests, back.requests
    assert after.reason == before.reason == "prefill: chunk 1 of 3 (16 of 40 tokens, 0 from cache)"
    assert after.timeline == before.timeline
    _run(engine)


def test_structured_request_records_its_grammar_compile_time(tiny_llama_dir):
    from kvdeck.engine.types.structured import StructuredOutputsParams

    params = SamplingParams(temperature=0, max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=["north", "south"]))
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01) as llm:
        output = llm.generate(["Which way?"], params)[0]
    timeline = output.metrics.timeline
    assert timeline.grammar_compile_s is not None and timeline.grammar_compile_s > 0
    assert timeline.grammar_compile_s == output.metrics.grammar_compile_s
    assert timeline.finish_reason == "stop"  # the grammar was complete


def test_async_scheduling_records_the_same_timeline(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, max_num_batched_tokens=16,
             async_scheduling=True) as llm:
        output = llm.generate([{"prompt_token_ids": list(range(10, 50))}], GREEDY)[0]
    timeline = output.metrics.timeline
    assert _phases(timeline) == [QUEUED, PREFILL, DECODE, FINISHED]
    assert [tokens for _, tokens, _ in timeline.prefill_chunks] == [16, 16, 8]
    assert sum(tokens for *_, tokens in timeline.decode_runs) == 5
    assert timeline.ttft.total_s > 0
