"""/metrics for the KV tiers (app/serve/tier_metrics.py): vLLM's names where they exist."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvdeck.app.serve.tier_metrics import kv_tier_families
from tests.tui.demo_stats import demo_stats


def _scrape(stats) -> dict[str, float]:
    class Tiers:
        def collect(self):
            return kv_tier_families(stats, ["model_name"], ["m"])

    registry = CollectorRegistry()
    registry.register(Tiers())
    text = generate_latest(registry).decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples}


def test_nothing_without_tiers():
    assert _scrape(demo_stats(0)) == {}


def test_swap_space_and_prefix_tiers():
    stats = demo_stats(0)
    stats.host_swap_blocks_total, stats.host_swap_blocks_used, stats.num_swapped = 200, 50, 3
    stats.swap_outs_total, stats.swap_ins_total = 7, 4
    stats.swap_out_blocks_total, stats.swap_in_blocks_total, stats.swap_seconds_total = 70, 40, 0.25
    stats.host_cache_blocks_total, stats.host_cache_blocks = 1000, 10
    stats.host_cache_queries, stats.host_cache_hits = 400, 100
    stats.disk_cache_blocks_total, stats.disk_cache_blocks = 5000, 60
    stats.disk_cache_queries, stats.disk_cache_hits = 300, 200
    got = _scrape(stats)
    assert got["vllm:num_requests_swapped"] == 3 and got["vllm:cpu_cache_usage_perc"] == 0.25
    assert got["kvdeck:swap_outs_total"] == 7 and got["kvdeck:swap_in_blocks_total"] == 40
    assert got["kvdeck:swap_seconds_total"] == 0.25 and got["kvdeck:host_swap_blocks_total"] == 200
    assert got["vllm:external_prefix_cache_queries_total"] == 400
    assert got["vllm:external_prefix_cache_hits_total"] == 300
    assert got["kvdeck:host_cache_blocks"] == 10 and got["kvdeck:disk_cache_blocks_total"] == 5000
    assert got["kvdeck:disk_cache_hits_total"] == 200 and got["kvdeck:host_cache_queries_total"] == 400
