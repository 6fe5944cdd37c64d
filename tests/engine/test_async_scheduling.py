"""Async scheduling (engine/core/pipeline.py) against the synchronous engine, token for token:
greedy and seeded outputs equal with EOS, stop tokens, stop strings, max_tokens, n > 1,
preemption and prefix caching. On the CPU the device step is simulated by a thread whose
results are futures (engine/runner/async_step.py's SimulatedDevice), here slowed down so the
host runs ahead of it: the same code path as on a GPU."""

import json
import random
import shutil
import time
from collections import Counter

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner import model_runner

PREFIX = list(range(40, 80))


@pytest.fixture
def slow_device(monkeypatch):
    """Each simulated device step takes a few ms more, so the host schedules, packs and
    resolves while the device still works (a delayed future)."""
    work = model_runner.ModelRunner._device_work

    def delayed(self, inputs, previous):
        time.sleep(0.003)
        return work(self, inputs, previous)

    monkeypatch.setattr(model_runner.ModelRunner, "_device_work", delayed)


def _prompts(count: int, seed: int, shared_prefix: bool = False) -> list[list[int]]:
    rng = random.Random(seed)
    return [(PREFIX if shared_prefix and i % 2 else [])
            + [rng.randrange(5, 300) for _ in range(rng.randint(3, 40))] for i in range(count)]


def _generate(model, prompts, params, **engine):
    with LLM(str(model), kv_cache_memory_gib=0.01, max_num_batched_tokens=48, **engine) as llm:
        outs = llm.generate(prompts, params)
        stats = llm.stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0
        assert not llm.engine.core.step_in_flight
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs], stats


def _equal_both_ways(model, prompts, params, **engine):
    sync, sync_stats = _generate(model, prompts, params, async_scheduling=False, **engine)
    pipelined, stats = _generate(model, prompts, params, async_scheduling=True, **engine)
    assert pipelined == sync
    return sync, stats, sync_stats


def test_greedy_with_eos_and_max_tokens(tiny_llama_dir, tmp_path, slow_device):
    prompts = _prompts(16, 0)
    free, _ = _generate(tiny_llama_dir, prompts,
                        SamplingParams(temperature=0, max_tokens=28, ignore_eos=True), async_scheduling=False)
    # A copy of the model whose EOS is a token its greedy outputs reach midway.
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    eos = Counter(t for out in free for t in out[0][0][3:20]).most_common(1)[0][0]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    params = [SamplingParams(temperature=0, max_tokens=1 + i * 3 % 29, ignore_eos=i % 3 == 0)
              for i in range(16)]
    outs, stats, _ = _equal_both_ways(model, prompts, params)
    ends = [(o[0][2], o[0][3]) for o in outs]
    assert ("length", None) in ends and ("stop", None) in ends  # max_tokens and EOS
    for out, p in zip(outs, params):
        assert len(out[0][0]) <= p.max_tokens  # never past max_tokens
    assert stats.num_steps > 10


def test_stop_tokens_and_stop_strings(tiny_llama_dir, slow_device):
    prompts = _prompts(8, 1)
    free, _ = _generate(tiny_llama_dir, prompts,
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), async_scheduling=False)
    params = []
    for i, out in enumerate(free):
        tokens, text = out[0][0], out[0][1]
        if i % 2:  # a token it samples midway stops it
            params.append(SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                         stop_token_ids=[tokens[len(tokens) // 2]]))
        else:  # a string it writes midway (the front-end finds it, then stops the core)
            stop = text[len(text) // 2 : len(text) // 2 + 2]
            params.append(SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                         stop=[stop] if stop.strip() else []))
    outs, _, _ = _equal_both_ways(tiny_llama_dir, prompts, params)
    assert sum(o[0][2] == "stop" for o in outs) >= 4


def test_n_choices_seeded_and_greedy(tiny_llama_dir, slow_device):
    prompts = _prompts(4, 2)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=7 + i, n=3, max_tokens=12) for i in range(2)]
    params += [SamplingParams(temperature=0, n=2, max_tokens=9, ignore_eos=True)] * 2
    outs, _, _ = _equal_both_ways(tiny_llama_dir, prompts, params)
    assert [len(o) for o in outs] == [3, 3, 2, 2]


def test_preemption(tiny_llama_dir, slow_device):
    prompts = _prompts(10, 3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    _, stats, sync_stats = _equal_both_ways(tiny_llama_dir, prompts, params, num_gpu_blocks_override=14,
                                            max_model_len=96)
    assert stats.num_preemptions > 0 and sync_stats.num_preemptions > 0


def test_prefix_caching(tiny_llama_dir, slow_device):
    prompts = _prompts(12, 4, shared_prefix=True)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    _, stats, _ = _equal_both_ways(tiny_llama_dir, prompts, params)
    assert stats.prefix_cache_hits > 0


def test_requests_that_need_host_tokens_run_synchronously(tiny_llama_dir, slow_device):
    prompts = _prompts(6, 5)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                             repetition_penalty=1.3 if i == 2 else 1.0) for i in range(6)]
    _equal_both_ways(tiny_llama_dir, prompts, params)


def test_the_host_runs_a_step_ahead(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, async_scheduling=True) as llm:
        engine = llm.engine
        engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        assert engine.step() == [] and engine.core.step_in_flight  # launched, nothing back yet
        tokens = []
        while engine.has_unfinished_requests():
            tokens += [t for out in engine.step() for t in out.delta_token_ids]
        assert len(tokens) == 3 and not engine.core.step_in_flight


def test_async_scheduling_is_off_on_the_cpu_by_default(tiny_llama_dir):
    with LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01) as llm:
        assert llm.engine.core.pipeline is None
