"""Alerts where users are surprised: fallbacks at start, a kernel compiled mid-run, a request
preempted again and again; each said once."""

import dataclasses

from kvdeck.engine.types.request_timeline import TimelineSnapshot
from kvdeck.engine.types.wire import EngineInfo
from kvdeck.tui.alerts import EngineAlerts
from tests.tui.demo_stats import demo_stats


def _info(**fields) -> EngineInfo:
    return EngineInfo(model_dir="m", max_model_len=128, vocab_size=400, num_blocks=8, block_size=16,
                      device="cpu", dtype="float32", kv_bytes_per_token=64, kv_cache_dtype="float32",
                      enable_prefix_caching=True, weight_bytes_per_token=1000, cuda_graphs=False,
                      **fields)


def test_fallbacks_are_said_at_start():
    alerts = EngineAlerts()
    said = alerts.on_ready(_info(fallbacks=["no CUDA GPU found: running on the CPU"]))
    assert said == ["no CUDA GPU found: running on the CPU"] and alerts.recent == said
    assert alerts.on_ready(_info()) == [] and alerts.on_ready(None) == []


def test_a_kernel_compiled_while_serving_is_said_once_per_compile():
    alerts = EngineAlerts()
    stats = demo_stats(0)
    assert alerts.observe(dataclasses.replace(stats, kernel_compiles_total=5)) == []  # warm-up's
    assert alerts.observe(dataclasses.replace(stats, kernel_compiles_total=5)) == []
    (said,) = alerts.observe(dataclasses.replace(stats, kernel_compiles_total=7))
    assert said.startswith("2 kernels compiled while serving")
    assert alerts.observe(dataclasses.replace(stats, kernel_compiles_total=7)) == []
    alerts.reset()  # a new engine counts from zero
    assert alerts.observe(dataclasses.replace(stats, kernel_compiles_total=1)) == []


def test_a_request_preempted_repeatedly_is_said_once():
    alerts = EngineAlerts()
    stats = demo_stats(3)
    assert stats.requests, "the demo snapshot has requests"
    first = stats.requests[0]
    once = TimelineSnapshot(queued_at=0.0, taken_at=1.0, preemptions=[(0.5, 3, "")])
    twice = TimelineSnapshot(queued_at=0.0, taken_at=2.0, preemptions=[(0.5, 3, ""), (1.5, 9, "b")])
    requests = [dataclasses.replace(first, timeline=once)]
    assert alerts.observe(dataclasses.replace(stats, requests=requests)) == []
    requests = [dataclasses.replace(first, timeline=twice)]
    (said,) = alerts.observe(dataclasses.replace(stats, requests=requests))
    assert said.startswith(f"{first.request_id} was preempted 2 times: the KV pool is too small")
    assert alerts.observe(dataclasses.replace(stats, requests=requests)) == []
