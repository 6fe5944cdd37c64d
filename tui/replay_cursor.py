"""Replay's position in a recording, and the dashboard state at that position.

The dashboard's widgets read a DashboardState whatever feeds it; here a recording does:
moving to snapshot i puts in the state what a live dashboard had at that moment (the
snapshot itself, the histories of the HISTORY_LEN snapshots before it, the latencies up to
it) and the requests the inspector had seen finish. Small steps forward add the new
snapshots to the state, as the live feed would; anything else rebuilds it from the window
before the new position.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvdeck.app.record.format import ORDER
from kvdeck.tui.dashboard_state import HISTORY_LEN, LATENCY_LEN, DashboardState
from kvdeck.tui.widgets.request_inspector import KEEP_FINISHED

if TYPE_CHECKING:
    from kvdeck.app.record.reader import Recording
    from kvdeck.engine.types.stats import EngineStats, RequestStats

SPEEDS = (1, 2, 4, 8, 16)  # play speeds (times real time)
FORWARD_INCREMENTAL = 64  # steps forward up to this many snapshots add to the state
LATENCY_LOOKBACK_S = 600.0  # latencies before the history window still fill the graphs


@dataclass(slots=True, frozen=True)
class WorstTTFT:
    ttft_s: float
    at: float  # when its first token came (the moment replay jumps to)
    request_id: str | None  # None: only the latency sample is known (no timeline)


@dataclass(slots=True)
class _SpecCounters:
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int


@dataclass(slots=True)
class _HistoryPoint:
    """What DashboardState.add_stats reads of a snapshot for its histories: the snapshots
    before the shown one are fed as these (building each EngineStats, with its block map,
    made a step back take half a second on a 10,922-block pool)."""

    timestamp: float
    kv_cache_usage: float
    generation_tokens_total: int
    spec: _SpecCounters | None


def _history_point(state: dict) -> _HistoryPoint:
    spec = state.get("spec")
    return _HistoryPoint(state["timestamp"], state["kv_cache_usage"],
                         state["generation_tokens_total"],
                         _SpecCounters(spec["num_drafts"], spec["num_draft_tokens"],
                                       spec["num_accepted_tokens"]) if spec else None)


class ReplayCursor:
    def __init__(self, recording: Recording, state: DashboardState) -> None:
        self.recording = recording
        self.state = state
        self.times = recording.snapshot_times()
        self.index = -1  # the snapshot shown
        # The requests the inspector had seen finish: id -> the stored snapshot it was last in.
        self._finished: OrderedDict[str, dict] = OrderedDict()
        self._last_state: dict | None = None
        self.speed_index = 0
        self.playing = False
        self.version = 0  # bumped on every move (the position bar redraws on change)
        self._worst: tuple[WorstTTFT | None] | None = None
        self.seek_index(0)

    # ---- where ------------------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.times[self.index]

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        return self.times[-1]

    @property
    def stats(self) -> EngineStats:
        assert self.state.stats is not None
        return self.state.stats

    @property
    def finished(self) -> list[RequestStats]:
        """The requests the inspector lists as finished at this moment, oldest first."""
        return [self.recording.decode_request(state, rid) for rid, state in self._finished.items()]

    @property
    def speed(self) -> int:
        return SPEEDS[self.speed_index]

    @property
    def at_end(self) -> bool:
        return self.index >= len(self.times) - 1

    # ---- moves ------------------------------------------------------------------------------
    def seek(self, t: float) -> None:
        """The snapshot at or before t (the first, for a t before it)."""
        self.seek_index(max(0, bisect.bisect_right(self.times, t) - 1))

    def step(self, snapshots: int) -> None:
        self.seek_index(self.index + snapshots)

    def skip(self, seconds: float) -> None:
        """Move by a time: at least one snapshot, so a move always shows something new."""
        target = max(0, bisect.bisect_right(self.times, self.t + seconds) - 1)
        if target == self.index:
            target += 1 if seconds > 0 else -1
        self.seek_index(target)

    def seek_index(self, index: int) -> None:
        index = min(max(index, 0), len(self.times) - 1)
        if index == self.index:
            return
        if self.index >= 0 and self.index < index <= self.index + FORWARD_INCREMENTAL:
            self._advance(index)
        else:
            self._rebuild(index)
        self.index = index
        self.version += 1

    def faster(self) -> None:
        self.speed_index = min(self.speed_index + 1, len(SPEEDS) - 1)
        self.version += 1

    def slower(self) -> None:
        self.speed_index = max(self.speed_index - 1, 0)
        self.version += 1

    def toggle_play(self) -> None:
        if not self.playing and self.at_end:
            self.seek_index(0)  # played to the end: again from the start
        self.playing = not self.playing
        self.version += 1

    def tick(self, wall_seconds: float) -> None:
        """Playing: move on by `wall_seconds` at the current speed (stops at the end)."""
        if not self.playing:
            return
        target = max(0, bisect.bisect_right(self.times, self.t + wall_seconds * self.speed) - 1)
        if target > self.index:
            self.seek_index(target)
        if self.at_end:
            self.playing = False
            self.version += 1

    # ---- the worst TTFT ----------------------------------------------------------------------
    def worst_ttft(self) -> WorstTTFT | None:
        """The slowest first token of the recording: a finished request's (its timeline's
        TTFT, so the inspector can show the request) or a TTFT sample's, whichever is
        slower. Found once (it reads the whole file)."""
        if self._worst is not None:
            return self._worst[0]
        candidates = [WorstTTFT(s, at, None) for kind, at, s in self.recording.latencies()
                      if kind == "ttft"]
        for request in self.recording.finished_requests():
            ttft = request.timeline.ttft if request.timeline is not None else None
            if ttft is not None and request.arrival_time is not None:
                candidates.append(WorstTTFT(ttft.total_s, request.arrival_time + ttft.total_s,
                                            request.request_id))
        # The slowest; at a tie, one that names its request.
        worst = max(candidates, key=lambda w: (w.ttft_s, w.request_id is not None), default=None)
        self._worst = (worst,)
        return worst

    # ---- the state ---------------------------------------------------------------------------
    def _rebuild(self, index: int) -> None:
        state = self.state
        state.reset()
        state.origin = self.times[0]  # the graphs' x axis: seconds since the recording began
        state.latency_feed = True
        state.source = "kvdeck"
        self._finished.clear()
        self._last_state = None
        first = max(0, index - HISTORY_LEN + 1)
        self._feed(self.recording.snapshot_states(first, index))
        latencies = self.recording.latencies(self.times[first] - LATENCY_LOOKBACK_S,
                                             self.times[index])
        for kind, at, seconds in latencies[-LATENCY_LEN:]:
            state.add_feed_latency(kind, at, seconds)

    def _advance(self, index: int) -> None:
        self._feed(self.recording.snapshot_states(self.index + 1, index))
        for kind, at, seconds in self.recording.latencies(self.times[self.index],
                                                          self.times[index]):
            if at > self.times[self.index]:
                self.state.add_feed_latency(kind, at, seconds)

    def _feed(self, states: list[dict]) -> None:
        """Snapshots, as the live dashboard takes them (the last one whole, the others for
        the histories); the requests gone from one to the next join the finished list the
        inspector keeps (its KEEP_FINISHED)."""
        for number, stored in enumerate(states):
            last = number == len(states) - 1
            point = self.recording.decode_state(stored) if last else _history_point(stored)
            self.state.add_stats(cast("EngineStats", point))
            current = stored["requests"]
            previous = self._last_state
            if previous is not None:
                for rid in previous[ORDER]:
                    if rid not in current:
                        self._finished.pop(rid, None)
                        self._finished[rid] = previous
            for rid in [rid for rid in self._finished if rid in current]:
                del self._finished[rid]
            while len(self._finished) > KEEP_FINISHED:
                self._finished.popitem(last=False)
            self._last_state = stored
