"""One line of engine figures above the chat, for narrow terminals where the dashboard is
hidden behind f2."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kvdeck.tui.dashboard_state import DashboardState

REFRESH_S = 0.25


def mini_line(state: DashboardState) -> Text:
    stats = state.stats
    if stats is None:
        return Text("engine: no statistics yet", style="italic")
    text = Text()
    text.append(f"run {stats.num_running} wait {stats.num_waiting} "
                f"pre {stats.num_preempted} · KV ")
    text.append(f"{stats.kv_cache_usage * 100:.0f}%", style="bold")
    text.append(f" · {state.tokens_per_s:.0f} tok/s · f2 dashboard")
    return text


class MiniStats(Static):
    def __init__(self, state: DashboardState, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = state
        self._seen = -1

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self.redraw)
        self.redraw()

    def redraw(self) -> None:
        state = self.state
        if state.version != self._seen:
            self._seen = state.version
            self.update(mini_line(state))
