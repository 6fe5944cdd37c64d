"""What the dashboard draws: the latest engine snapshot plus short histories.

Fed from two sides: EngineStats snapshots (the stats stream) and per-request latencies
observed on the token streams (TTFT, ITL). Widgets read it on their refresh timer, so a
burst of snapshots never causes a burst of redraws.

Attached to a server (`kvdeck attach`), a kvdeck server sends the same snapshots plus the
latencies of every request it serves (`latency_feed`: the UI's own observations of its
replies would count them twice); a vLLM server only has /metrics, whose summaries
(`add_metrics`) feed the same histories and headline figures, with no block map.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.types.stats import RequestStats, final_request_stats

if TYPE_CHECKING:
    from kvdeck.app.attach.metrics_view import MetricsView
    from kvdeck.app.record.session import SessionRecorder
    from kvdeck.engine.types.outputs import RequestOutput
    from kvdeck.engine.types.stats import EngineStats

HISTORY_LEN = 240  # samples kept for the KV and throughput histories
LATENCY_LEN = 400  # latency points kept for each graph
THROUGHPUT_WINDOW_S = 1.0  # tokens/s is measured over at least this much engine time
ENDED_LEN = 64  # finished requests' final figures kept for the inspector


@dataclass(slots=True)
class DashboardState:
    stats: EngineStats | None = None
    version: int = 0  # bumped on every snapshot so widgets redraw only on change
    latency_version: int = 0
    origin: float | None = None  # first timestamp seen: x = 0 of the time graphs
    # (seconds since origin, value) samples, one per snapshot
    kv_history: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_LEN)
    )
    throughput_history: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_LEN)
    )
    ttft_points: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=LATENCY_LEN)
    )  # (seconds since origin, TTFT ms)
    itl_points: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=LATENCY_LEN)
    )  # (seconds since origin, ITL ms)
    tokens_per_s: float = 0.0
    max_model_len: int | None = None  # the loaded model's context (how many requests fit)
    source: str = "engine"  # "engine" (local) | "kvdeck" (attached) | "openai" (metrics only)
    source_label: str = ""  # what the dashboard calls an attached server ("vLLM at URL")
    connected: bool = True  # False: an attached server is unreachable; figures are the last
    latency_feed: bool = False  # latencies come from the server's feed, not the UI's replies
    metrics: MetricsView | None = None  # the last /metrics summary (source "openai")
    # Speculative decoding, between consecutive snapshots that verified drafts: (seconds
    # since origin, share of drafted tokens accepted) and (.., drafts accepted per step).
    acceptance_history: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_LEN)
    )
    accepted_per_step_history: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_LEN)
    )
    _spec_counters: tuple[int, int, int] | None = None  # (drafts, drafted, accepted) last seen
    _generation_marks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=512))
    recorder: SessionRecorder | None = None  # while recording: gets every snapshot and latency
    # Finished requests as their final outputs describe them (a local engine's, or an
    # attached kvdeck server's), numbered in order: the last snapshot a request was in
    # predates its last steps (a speculative step writes several tokens), and a short
    # request may end between two snapshots.
    ended: deque[tuple[int, RequestStats]] = field(default_factory=lambda: deque(maxlen=ENDED_LEN))
    _ended_count: int = 0

    def add_stats(self, stats: EngineStats) -> None:
        if self.recorder is not None:
            self.recorder.on_stats(stats)
        if self.origin is None:
            self.origin = stats.timestamp
        self.stats = stats
        self.version += 1
        t = stats.timestamp - self.origin
        self.kv_history.append((t, stats.kv_cache_usage))
        self.tokens_per_s = self._throughput(stats.timestamp, stats.generation_tokens_total)
        self.throughput_history.append((t, self.tokens_per_s))
        if stats.spec is not None:
            self._add_spec(t, stats.spec.num_drafts, stats.spec.num_draft_tokens,
                           stats.spec.num_accepted_tokens)

    def _add_spec(self, t: float, drafts: int, drafted: int, accepted: int) -> None:
        last, self._spec_counters = self._spec_counters, (drafts, drafted, accepted)
        if last is None or drafts < last[0]:
            return  # the first snapshot, or a restarted engine: no interval yet
        new_drafts, new_drafted = drafts - last[0], drafted - last[1]
        if new_drafts and new_drafted:  # nothing verified in between: no point to draw
            self.acceptance_history.append((t, (accepted - last[2]) / new_drafted))
            self.accepted_per_step_history.append((t, (accepted - last[2]) / new_drafts))

    def _throughput(self, timestamp: float, generated_total: int) -> float:
        marks = self._generation_marks
        if marks and (timestamp < marks[-1][0] or generated_total < marks[-1][1]):
            marks.clear()  # the engine restarted: counters went back to zero
        marks.append((timestamp, generated_total))
        # Oldest mark still inside the window, but keep one mark older than the window so
        # the rate spans at least THROUGHPUT_WINDOW_S when the history allows it.
        while len(marks) > 2 and timestamp - marks[1][0] >= THROUGHPUT_WINDOW_S:
            marks.popleft()
        first_t, first_n = marks[0]
        elapsed = timestamp - first_t
        if elapsed <= 0:
            return self.tokens_per_s if len(marks) > 1 else 0.0
        return (generated_total - first_n) / elapsed

    def add_output(self, output: RequestOutput) -> None:
        """A local engine's output (its output listener: one choice each, under its engine
        request id); a final one is kept in `ended`."""
        if output.finished:
            self.add_ended(final_request_stats(output))

    def add_ended(self, request: RequestStats) -> None:
        """A finished request's final figures (a local engine's output, or an attached
        kvdeck server's feed)."""
        self._ended_count += 1
        self.ended.append((self._ended_count, request))
        self.version += 1

    def add_metrics(self, view: MetricsView, timestamp: float) -> None:
        """A /metrics summary: KV usage, throughput and the TTFT / ITL medians over time."""
        if self.origin is None:
            self.origin = timestamp
        self.metrics = view
        self.version += 1
        t = timestamp - self.origin
        if view.kv_cache_usage is not None:
            self.kv_history.append((t, view.kv_cache_usage))
        self.tokens_per_s = view.generation_tokens_per_s or 0.0
        self.throughput_history.append((t, self.tokens_per_s))
        for name, points in (("ttft", self.ttft_points), ("itl", self.itl_points)):
            median = view.latencies.get(name, {}).get(0.5)
            if median is not None:
                points.append((t, median * 1000.0))
                self.latency_version += 1

    def add_feed_latency(self, kind: str, at: float, seconds: float) -> None:
        """A latency the server observed (kind "ttft" or "itl")."""
        if self.recorder is not None:
            self.recorder.on_latency(kind, at, seconds)
        points = self.ttft_points if kind == "ttft" else self.itl_points
        points.append((self._since_origin(at), seconds * 1000.0))
        self.latency_version += 1

    def add_ttft(self, at: float, ttft_s: float) -> None:
        if self.latency_feed:
            return
        if self.recorder is not None:
            self.recorder.on_latency("ttft", at, ttft_s)
        self.ttft_points.append((self._since_origin(at), ttft_s * 1000.0))
        self.latency_version += 1

    def add_itl(self, at: float, itl_s: float) -> None:
        if self.latency_feed:
            return
        if self.recorder is not None:
            self.recorder.on_latency("itl", at, itl_s)
        self.itl_points.append((self._since_origin(at), itl_s * 1000.0))
        self.latency_version += 1

    def _since_origin(self, at: float) -> float:
        if self.origin is None:
            self.origin = at
        return at - self.origin

    def latest_time(self) -> float:
        """Seconds since start of the newest sample of any series (the graphs' "now")."""
        last = [series[-1][0] for series in (self.kv_history, self.ttft_points, self.itl_points)
                if series]
        return max(last, default=0.0)

    @property
    def prefix_hit_rate(self) -> float | None:
        if self.stats is None and self.metrics is not None:
            return self.metrics.prefix_cache_hit_rate
        if self.stats is None or self.stats.prefix_cache_queries == 0:
            return None
        return self.stats.prefix_cache_hits / self.stats.prefix_cache_queries

    def reset(self) -> None:
        """Forget everything (a restarted engine starts its counters again)."""
        self.stats = None
        self.metrics = None
        self.origin = None
        self.tokens_per_s = 0.0
        for history in (self.kv_history, self.throughput_history, self.ttft_points,
                        self.itl_points, self._generation_marks, self.acceptance_history,
                        self.accepted_per_step_history, self.ended):
            history.clear()
        self._spec_counters = None
        self.version += 1
        self.latency_version += 1
