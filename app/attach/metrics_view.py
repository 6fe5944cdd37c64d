"""What the dashboard shows of a server it can only scrape (vLLM, or anything exporting
vLLM's metric names): gauges as they are, counters as rates and latency percentiles over
a recent window, computed from two scrapes as Prometheus would."""

from collections import deque
from dataclasses import dataclass, field

from kvdeck.app.attach.prometheus import Histogram, Scrape, rate

WINDOW_S = 30.0  # rates and percentiles span about this much time
QUANTILES = (0.5, 0.9, 0.99)
# (what the dashboard calls it, the metric; older vLLM names after the first)
LATENCIES = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}


@dataclass(slots=True)
class MetricsView:
    kv_cache_usage: float | None = None  # 0..1
    num_running: float | None = None
    num_waiting: float | None = None
    preemptions_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None  # over the window
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    spec_acceptance_rate: float | None = None  # accepted / proposed draft tokens, over the window
    # The rates behind the two ratios, so replicas can be summed before dividing.
    prefix_cache_hits_per_s: float | None = None
    prefix_cache_queries_per_s: float | None = None
    spec_accepted_per_s: float | None = None
    spec_drafted_per_s: float | None = None
    # name -> {quantile: seconds} over the window ("ttft", "itl", "e2e", "queue")
    latencies: dict[str, dict[float, float | None]] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)  # the window's observations
    models: list[str] = field(default_factory=list)
    window_s: float = 0.0


def window_start(history: deque[Scrape], window_s: float = WINDOW_S) -> Scrape | None:
    """The oldest scrape still inside the window (else the oldest kept)."""
    if len(history) < 2:
        return None
    newest = history[-1].timestamp
    for scrape in history:
        if newest - scrape.timestamp <= window_s:
            return scrape if scrape is not history[-1] else history[-2]
    return history[-2]


def summarise(history: deque[Scrape], window_s: float = WINDOW_S) -> MetricsView:
    now = history[-1]
    before = window_start(history, window_s)
    kv = now.value("vllm:kv_cache_usage_perc")
    if kv is None:
        kv = now.value("vllm:gpu_cache_usage_perc")
    engines = max(1, len(now.label_values("vllm:num_requests_running", "engine")))
    view = MetricsView(
        kv_cache_usage=None if kv is None else kv / engines,  # a mean over engines, as usage
        num_running=now.value("vllm:num_requests_running"),
        num_waiting=now.value("vllm:num_requests_waiting"),
        preemptions_per_s=rate(before, now, "vllm:num_preemptions_total"),
        generation_tokens_per_s=rate(before, now, "vllm:generation_tokens_total"),
        prompt_tokens_per_s=rate(before, now, "vllm:prompt_tokens_total"),
        prefix_cache_hit_rate=_ratio(before, now, "vllm:prefix_cache_hits_total",
                                     "vllm:prefix_cache_queries_total"),
        spec_acceptance_rate=_ratio(before, now, "vllm:spec_decode_num_accepted_tokens_total",
                                    "vllm:spec_decode_num_draft_tokens_total"),
        prefix_cache_hits_per_s=rate(before, now, "vllm:prefix_cache_hits_total"),
        prefix_cache_queries_per_s=rate(before, now, "vllm:prefix_cache_queries_total"),
        spec_accepted_per_s=rate(before, now, "vllm:spec_decode_num_accepted_tokens_total"),
        spec_drafted_per_s=rate(before, now, "vllm:spec_decode_num_draft_tokens_total"),
        models=sorted(now.label_values("vllm:num_requests_running", "model_name")),
        window_s=now.timestamp - before.timestamp if before else 0.0,
    )
    for name, candidates in LATENCIES.items():
        for metric in candidates:
            current = now.histogram(metric)
            if current is None:
                continue
            recent = current.minus(before.histogram(metric) if before else None)
            view.histograms[name] = recent
            view.latencies[name] = {q: recent.quantile(q) for q in QUANTILES}
            break
    return view


def combine(views: list[MetricsView]) -> MetricsView:
    """Several replicas as one: loads and rates summed, usage averaged, latencies from the
    merged histograms."""
    if not views:
        return MetricsView()

    def total(attr: str) -> float | None:
        values = [getattr(v, attr) for v in views if getattr(v, attr) is not None]
        return sum(values) if values else None

    usage = [v.kv_cache_usage for v in views if v.kv_cache_usage is not None]
    merged = MetricsView(
        kv_cache_usage=sum(usage) / len(usage) if usage else None,
        num_running=total("num_running"), num_waiting=total("num_waiting"),
        preemptions_per_s=total("preemptions_per_s"),
        generation_tokens_per_s=total("generation_tokens_per_s"),
        prompt_tokens_per_s=total("prompt_tokens_per_s"),
        prefix_cache_hits_per_s=total("prefix_cache_hits_per_s"),
        prefix_cache_queries_per_s=total("prefix_cache_queries_per_s"),
        spec_accepted_per_s=total("spec_accepted_per_s"),
        spec_drafted_per_s=total("spec_drafted_per_s"),
        models=sorted({m for v in views for m in v.models}),
        window_s=max(v.window_s for v in views),
    )
    if merged.prefix_cache_queries_per_s and merged.prefix_cache_hits_per_s is not None:
        merged.prefix_cache_hit_rate = merged.prefix_cache_hits_per_s / merged.prefix_cache_queries_per_s
    if merged.spec_drafted_per_s and merged.spec_accepted_per_s is not None:
        merged.spec_acceptance_rate = merged.spec_accepted_per_s / merged.spec_drafted_per_s
    for name in LATENCIES:
        parts = [v.histograms[name] for v in views if name in v.histograms]
        if parts and all(len(p.buckets) == len(parts[0].buckets) for p in parts):
            summed = Histogram([(le, sum(p.buckets[i][1] for p in parts))
                                for i, (le, _) in enumerate(parts[0].buckets)],
                               sum(p.count for p in parts), sum(p.sum for p in parts))
            merged.histograms[name] = summed
            merged.latencies[name] = {q: summed.quantile(q) for q in QUANTILES}
    return merged


def _ratio(before: Scrape | None, now: Scrape, part: str, whole: str) -> float | None:
    got, of = rate(before, now, part), rate(before, now, whole)
    if got is None or not of:
        return None
    return got / of
