"""/metrics for the KV tiers (docs/architecture/kv-tiers.md): vLLM's names where vLLM has the
figure, kvdeck:* for the rest.

- v0's swap space: `vllm:num_requests_swapped`, `vllm:cpu_cache_usage_perc` (the host swap
  space's blocks in use, 0-1).
- v1's prefix-cache hits outside the device pool (its KV connectors' offload tiers):
  `vllm:external_prefix_cache_queries` and `vllm:external_prefix_cache_hits`, in prompt tokens,
  summed over the host and disk tiers (queries: those the first tier below the device saw).
- kvdeck:* per tier: blocks held and room, lookups and hits, and swapping's counts and time.
Tiers that are not configured export nothing (vLLM's offload metrics are absent without a
connector too).
"""

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvdeck.engine.types.stats import EngineStats


class SampleFamilies:
    """One-sample metric families under the same labels (the model's name)."""

    def __init__(self, labels: list[str], values: list[str]) -> None:
        self.labels = labels
        self.values = values

    def gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=self.labels)
        family.add_metric(self.values, value)
        return family

    def counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=self.labels)
        family.add_metric(self.values, value)
        return family


def kv_tier_families(stats: EngineStats, labels: list[str], values: list[str]) -> Iterator:
    families = SampleFamilies(labels, values)
    gauge, counter = families.gauge, families.counter

    if stats.host_swap_blocks_total:
        yield gauge("vllm:num_requests_swapped", "Requests swapped out to host memory.", stats.num_swapped)
        yield gauge("vllm:cpu_cache_usage_perc", "Fraction of the host swap space's blocks in use (0-1).",
                    stats.host_swap_blocks_used / stats.host_swap_blocks_total)
        yield gauge("kvdeck:host_swap_blocks", "Host swap space blocks holding swapped-out K/V.",
                    stats.host_swap_blocks_used)
        yield gauge("kvdeck:host_swap_blocks_total", "Blocks the host swap space holds.",
                    stats.host_swap_blocks_total)
        yield counter("kvdeck:swap_outs", "Preempted requests swapped out to host memory.",
                      stats.swap_outs_total)
        yield counter("kvdeck:swap_ins", "Swapped-out requests swapped back in.", stats.swap_ins_total)
        yield counter("kvdeck:swap_out_blocks", "KV blocks copied to host swap space.",
                      stats.swap_out_blocks_total)
        yield counter("kvdeck:swap_in_blocks", "KV blocks copied back from host swap space.",
                      stats.swap_in_blocks_total)
        yield counter("kvdeck:swap_seconds", "Time the runner spent on swap copies.",
                      stats.swap_seconds_total)
    tiers = [(name, blocks, total, queries, hits) for name, blocks, total, queries, hits in (
        ("host", stats.host_cache_blocks, stats.host_cache_blocks_total, stats.host_cache_queries,
         stats.host_cache_hits),
        ("disk", stats.disk_cache_blocks, stats.disk_cache_blocks_total, stats.disk_cache_queries,
         stats.disk_cache_hits)) if total]
    if not tiers:
        return
    yield counter("vllm:external_prefix_cache_queries", "Prompt tokens looked up in the prefix "
                  "cache's tiers outside the device pool.", max(t[3] for t in tiers))
    yield counter("vllm:external_prefix_cache_hits", "Prompt tokens found in the prefix cache's "
                  "tiers outside the device pool.", sum(t[4] for t in tiers))
    for name, blocks, total, queries, hits in tiers:
        yield gauge(f"kvdeck:{name}_cache_blocks", f"Full prefix blocks in the {name} tier.", blocks)
        yield gauge(f"kvdeck:{name}_cache_blocks_total", f"Prefix blocks the {name} tier has room for.",
                    total)
        yield counter(f"kvdeck:{name}_cache_queries", f"Prompt tokens looked up in the {name} tier.",
                      queries)
        yield counter(f"kvdeck:{name}_cache_hits", f"Prompt tokens found in the {name} tier.", hits)
