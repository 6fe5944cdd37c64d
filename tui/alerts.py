"""Alerts where users are surprised: what the engine fell back from at start (no GPU found,
the CPU decoder stack off and why), a kernel compiled while serving (the steps around it
were slow), and a request preempted again and again (the KV pool is too small for the
load). Each is said once, as a notification; the dashboard's state keeps the last few.

The chat says for itself when a conversation no longer fits the context (chat_pane.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats
    from kvdeck.engine.types.wire import EngineInfo

REPEATED_PREEMPTIONS = 2  # a request preempted this often is worth a word
KEPT = 8  # alerts the dashboard keeps


@dataclass(slots=True)
class EngineAlerts:
    compiles_seen: int | None = None  # kernel_compiles_total at the first snapshot
    told_preempted: set[str] = field(default_factory=set)
    recent: list[str] = field(default_factory=list)

    def reset(self) -> None:
        """A new engine: its counters start over."""
        self.compiles_seen = None
        self.told_preempted.clear()

    def on_ready(self, info: EngineInfo | None) -> list[str]:
        return self._keep(list(getattr(info, "fallbacks", None) or []))

    def observe(self, stats: EngineStats) -> list[str]:
        """What this snapshot says that the user has not been told."""
        out = []
        compiles = stats.kernel_compiles_total
        if self.compiles_seen is not None and compiles > self.compiles_seen:
            count = compiles - self.compiles_seen
            out.append(f"{count} kernel{'s' if count > 1 else ''} compiled while serving: the "
                       "steps around it were slow (a shape warm-up did not cover)")
        self.compiles_seen = compiles
        for request in stats.requests:
            timeline = request.timeline
            times = len(timeline.preemptions) if timeline is not None else 0
            if times >= REPEATED_PREEMPTIONS and request.request_id not in self.told_preempted:
                self.told_preempted.add(request.request_id)
                out.append(f"{request.request_id} was preempted {times} times: the KV pool is "
                           "too small for this load (fewer concurrent requests, a smaller "
                           "max_model_len, or an 8-bit KV cache would keep it)")
        return self._keep(out)

    def _keep(self, alerts: list[str]) -> list[str]:
        self.recent = (self.recent + alerts)[-KEPT:]
        return alerts
