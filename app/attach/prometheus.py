"""Prometheus text exposition read back: samples summed over a server's label sets (its
engines), counter rates and histogram quantiles between two scrapes, as Prometheus'
`rate()` and `histogram_quantile()` compute them."""

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(slots=True)
class Histogram:
    buckets: list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last
    count: float
    sum: float

    def minus(self, earlier: "Histogram | None") -> "Histogram":
        """What was observed since `earlier` (a restart resets counts: then everything)."""
        if earlier is None or earlier.count > self.count or len(earlier.buckets) != len(self.buckets):
            return self
        buckets = [(le, count - before) for (le, count), (_, before) in zip(self.buckets, earlier.buckets)]
        return Histogram(buckets, self.count - earlier.count, self.sum - earlier.sum)

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket that holds the rank."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower  # the +Inf bucket: the highest finite bound, as Prometheus
                if cumulative == below:
                    return upper
                return lower + (upper - lower) * (rank - below) / (cumulative - below)
            lower, below = upper, cumulative
        return lower


@dataclass(slots=True)
class Scrape:
    timestamp: float  # when it was taken (time.monotonic())
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        """A gauge or counter summed over the label sets that match `labels`."""
        matches = [v for sample_labels, v in self.samples.get(name, ())
                   if all(sample_labels.get(k) == want for k, want in labels.items())]
        return sum(matches) if matches else None

    def histogram(self, name: str) -> Histogram | None:
        by_bound: dict[float, float] = {}
        for sample_labels, v in self.samples.get(f"{name}_bucket", ()):
            bound = float(sample_labels["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + v
        if not by_bound:
            return None
        return Histogram(sorted(by_bound.items()), self.value(f"{name}_count") or 0.0,
                         self.value(f"{name}_sum") or 0.0)

    def label_values(self, name: str, label: str) -> set[str]:
        return {labels[label] for labels, _ in self.samples.get(name, ()) if label in labels}


def parse(text: str, timestamp: float) -> Scrape:
    """ValueError when the text is not a Prometheus exposition."""
    scrape = Scrape(timestamp)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                scrape.samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except (ValueError, KeyError, IndexError) as exc:
        raise ValueError(f"not a Prometheus exposition: {exc}") from None
    return scrape


def rate(before: Scrape | None, after: Scrape, name: str) -> float | None:
    """Per-second increase of a counter between two scrapes (None without two)."""
    if before is None or after.timestamp <= before.timestamp:
        return None
    now, then = after.value(name), before.value(name)
    if now is None:
        return None
    then = then or 0.0  # a series that appeared since (a server just started) began at 0
    increase = now - then if now >= then else now  # a reset starts the counter again
    return increase / (after.timestamp - before.timestamp)
