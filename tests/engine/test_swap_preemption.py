"""Swap preemption end to end on a tiny random model: greedy outputs equal with swap, with
recompute and with no preemption at all (a pool big enough), under chunked prefill, prefix
caching, n > 1, async scheduling and speculative decoding; an abort while swapped out frees
its host slots; a swap shows on the request's timeline and reason line."""

import random

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.request_timeline import SWAPPED

PREFIX = list(range(40, 88))  # three full blocks shared by half the prompts
MAX_TOKENS = 40
POOL = dict(num_gpu_blocks_override=14, max_model_len=120)


def _prompts(count: int = 10, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [(PREFIX if i % 2 else []) + [rng.randrange(5, 300) for _ in range(rng.randint(20, 40))]
            for i in range(count)]


PARAMS = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, n=2 if i == 3 else 1)
          for i in range(10)]


def _generate(model, **engine):
    with LLM(str(model), max_num_batched_tokens=32, **engine) as llm:
        outs = llm.generate(_prompts(), PARAMS)
        stats = llm.stats()
        assert stats.num_running == stats.num_waiting == 0 and sum(stats.block_ref_counts) == 0
        assert stats.host_swap_blocks_used == 0  # every host slot came back
    return [[c.token_ids for c in o.outputs] for o in outs], stats


@pytest.fixture(scope="module")
def unpreempted(tiny_llama_dir):
    outs, stats = _generate(tiny_llama_dir, kv_cache_memory_gib=0.01, max_model_len=120)
    assert stats.num_preemptions == 0
    return outs


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
def test_greedy_outputs_equal_without_preemption(tiny_llama_dir, unpreempted, mode):
    outs, stats = _generate(tiny_llama_dir, preemption_mode=mode, **POOL)
    assert outs == unpreempted
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    if mode == "recompute":
        assert stats.swap_outs_total == 0 and stats.host_swap_blocks_total == 0
    else:
        assert stats.swap_outs_total > 0 and stats.swap_ins_total == stats.swap_outs_total
        assert stats.swap_out_blocks_total == stats.swap_in_blocks_total > 0
        assert stats.swap_seconds_total > 0 and stats.host_swap_blocks_total > 0


def test_async_scheduling_swaps_in_the_device_queues_order(tiny_llama_dir, unpreempted):
    outs, stats = _generate(tiny_llama_dir, preemption_mode="swap", async_scheduling=True, **POOL)
    assert outs == unpreempted and stats.swap_outs_total > 0


def test_speculative_decoding_with_swap(tiny_llama_dir, unpreempted):
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    outs, stats = _generate(tiny_llama_dir, preemption_mode="swap", speculative_config=ngram, **POOL)
    assert outs == unpreempted and stats.swap_outs_total > 0


def test_abort_while_swapped_frees_its_host_slots(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), preemption_mode="swap", max_num_batched_tokens=32, **POOL) as llm:
        engine = llm.engine
        for i, prompt in enumerate(_prompts(8)):
            engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                              ignore_eos=True))
        swap = engine.core.scheduler.swap
        for _ in range(500):
            engine.step()
            if swap.swapped:
                break
        victim = next(iter(swap.swapped))
        stats = llm.stats()
        entry = next(r for r in stats.requests if r.request_id == victim)
        assert entry.state == "swapped" and entry.reason.startswith("swapped out for ")
        assert entry.timeline.phases[-1][1] == SWAPPED and entry.timeline.swaps[-1][1] > 0
        used, held = stats.host_swap_blocks_used, len(swap.swapped[victim].slots)
        assert used == sum(len(r.slots) for r in swap.swapped.values()) and held > 0
        engine.abort_request(victim)
        assert victim not in swap.swapped
        assert llm.stats().host_swap_blocks_used == used - held
        while engine.has_unfinished_requests():
            engine.step()
        assert swap.host.num_used == 0 and llm.stats().kv_cache_usage == 0


def test_a_swap_costs_show_on_the_final_timeline(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), preemption_mode="swap", max_num_batched_tokens=32, **POOL) as llm:
        outs = llm.generate(_prompts(), SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    swaps = [s for o in outs for s in o.metrics.timeline.swaps]
    assert swaps and all(nbytes > 0 and seconds > 0 for _, nbytes, seconds in swaps)


def test_bad_options_are_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        LLM(str(tiny_llama_dir), preemption_mode="swapp")
    with pytest.raises(ValueError, match="swap_space must be"):
        LLM(str(tiny_llama_dir), swap_space=-1)
    with pytest.raises(ValueError, match="needs swap space"):
        LLM(str(tiny_llama_dir), preemption_mode="swap", swap_space=0)
