"""Reading a vLLM server's /metrics: gauges, rates and latency percentiles over a window,
equal to the ones computed independently (Prometheus' histogram_quantile by hand) from
the same histograms; several replicas combine."""

import random
from collections import deque

import httpx
import pytest

from kvdeck.app.attach.metrics_view import combine, summarise
from kvdeck.app.attach.prometheus import parse
from tests.attach.fake_vllm import ITL_BUCKETS, MODEL, TTFT_BUCKETS, VllmMetrics, create_app, serve


def independent_quantile(q: float, bounds: list[float], observations: list[float]) -> float:
    """histogram_quantile over these observations, written out from Prometheus' definition."""
    counts = [sum(1 for o in observations if o <= b) for b in bounds] + [len(observations)]
    rank = q * len(observations)
    for i, cumulative in enumerate(counts):
        if cumulative >= rank:
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            below = counts[i - 1] if i else 0
            return lower + (bounds[i] - lower) * (rank - below) / (cumulative - below)
    raise AssertionError


@pytest.fixture()
def vllm():
    metrics = VllmMetrics()
    running = serve(create_app(metrics))
    yield metrics, running.url
    running.stop()


def scrape(url: str, at: float):
    return parse(httpx.get(f"{url}/metrics", timeout=5).text, at)


def test_window_percentiles_equal_independent_ones(vllm):
    metrics, url = vllm
    rng = random.Random(0)
    old = [rng.uniform(0.5, 3.0) for _ in range(40)]  # before the window: must not count
    for value in old:
        metrics.ttft.labels(MODEL, "0").observe(value)
    history = deque([scrape(url, 0.0)])
    ttft = [rng.expovariate(20) for _ in range(300)]
    itl = [rng.uniform(0.01, 0.2) for _ in range(900)]
    for value in ttft:
        metrics.ttft.labels(MODEL, "0").observe(value)
    for value in itl:
        metrics.itl.labels(MODEL, "0").observe(value)
    metrics.generation.labels(MODEL, "0").inc(1200)
    metrics.queries.labels(MODEL, "0").inc(1000)
    metrics.hits.labels(MODEL, "0").inc(250)
    metrics.drafts.labels(MODEL, "0").inc(400)
    metrics.accepted.labels(MODEL, "0").inc(100)
    metrics.running.labels(MODEL, "0").set(7)
    metrics.kv.labels(MODEL, "0").set(0.42)
    history.append(scrape(url, 10.0))
    view = summarise(history)
    for q in (0.5, 0.9, 0.99):
        assert view.latencies["ttft"][q] == pytest.approx(independent_quantile(q, TTFT_BUCKETS, ttft))
        assert view.latencies["itl"][q] == pytest.approx(independent_quantile(q, ITL_BUCKETS, itl))
    assert view.generation_tokens_per_s == pytest.approx(120.0)
    assert view.prefix_cache_hit_rate == pytest.approx(0.25)
    assert view.spec_acceptance_rate == pytest.approx(0.25)
    assert view.num_running == 7 and view.kv_cache_usage == pytest.approx(0.42)
    assert view.models == [MODEL] and view.window_s == 10.0


def test_replicas_combine():
    servers = [VllmMetrics(), VllmMetrics()]
    observations = [[0.02, 0.05, 0.3], [0.01, 0.9]]
    for metrics, values in zip(servers, observations):
        for value in values:
            metrics.ttft.labels(MODEL, "0").observe(value)
        metrics.running.labels(MODEL, "0").set(2)
    # Prefix-cache hit rates of 90% and 10% over unequal traffic: 910 / 1100 together.
    for metrics, (hits, queries) in zip(servers, [(900, 1000), (10, 100)]):
        metrics.hits.labels(MODEL, "0").inc(hits)
        metrics.queries.labels(MODEL, "0").inc(queries)
    # From an empty scrape (a server just started) to now.
    views = [summarise(deque([parse("", 0.0), parse(m.render().decode(), 5.0)])) for m in servers]
    merged = combine(views)
    assert merged.num_running == 4
    assert merged.prefix_cache_hit_rate == pytest.approx(910 / 1100)
    every = observations[0] + observations[1]
    assert merged.latencies["ttft"][0.5] == pytest.approx(independent_quantile(0.5, TTFT_BUCKETS, every))
