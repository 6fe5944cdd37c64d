"""`kvdeck replay FILE`: the dashboard of a recorded session, full width and read-only (no
chat, no engine), with the position bar above it. Keys move through the recording; every
widget shows the moment the cursor is on (ReplayCursor fills the dashboard's state)."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header

from kvdeck.tui.replay_cursor import ReplayCursor
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.replay_bar import ReplayBar
from kvdeck.tui.widgets.request_inspector import RequestInspector
from kvdeck.tui.widgets.request_table import RequestTable

PLAY_TICK_S = 0.1


class ReplayScreen(Screen[None]):
    # priority: the request table takes ←→ otherwise (it moves by rows only: ↑↓ stay its).
    BINDINGS = [
        Binding("space", "play_pause", "Play/pause", id="replay_play", priority=True,
                tooltip="Play the recording from here at the shown speed (again: pause)"),
        Binding("left", "step(-1)", "◀ step", id="replay_step_back", priority=True,
                tooltip="Back one recorded engine step (one snapshot)"),
        Binding("right", "step(1)", "step ▶", id="replay_step_forward", priority=True,
                tooltip="Forward one recorded engine step (one snapshot)"),
        Binding("shift+left,comma", "skip(-1)", "-1 s", id="replay_back_second", priority=True,
                tooltip="Back one second"),
        Binding("shift+right,full_stop", "skip(1)", "+1 s", id="replay_forward_second",
                priority=True, tooltip="Forward one second"),
        Binding("pageup", "skip(-10)", "-10 s", id="replay_back_10s", show=False,
                tooltip="Back ten seconds"),
        Binding("pagedown", "skip(10)", "+10 s", id="replay_forward_10s", show=False,
                tooltip="Forward ten seconds"),
        Binding("home", "to_start", "Start", id="replay_start", show=False,
                tooltip="The recording's first moment"),
        Binding("end", "to_end", "End", id="replay_end", show=False,
                tooltip="The recording's last moment"),
        Binding("w", "worst_ttft", "Worst TTFT", id="replay_worst_ttft",
                tooltip="Jump to the slowest first token and show its request"),
        Binding("plus,equals_sign", "faster", "Faster", id="replay_faster", show=False,
                tooltip="Play faster (1x, 2x, 4x, 8x, 16x)"),
        Binding("minus", "slower", "Slower", id="replay_slower", show=False,
                tooltip="Play slower"),
        Binding("f3", "toggle_tab", "Next tab", id="replay_next_tab", show=False,
                tooltip="Next dashboard tab: block map, latency graphs, speculation"),
    ]

    HELP_GROUPS = [("The request table (Tab to it; ↑↓ move)", RequestTable.BINDINGS[:3])]

    def __init__(self, cursor: ReplayCursor) -> None:
        super().__init__()
        self.cursor = cursor
        self._played_at = time.monotonic()

    def compose(self) -> ComposeResult:
        yield Header(icon="▦")
        yield ReplayBar(self.cursor, id="replay-bar")
        yield Dashboard(self.cursor.state, id="dashboard")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(PLAY_TICK_S, self._play_tick)
        self._moved()

    @property
    def dashboard(self) -> Dashboard:
        return self.query_one(Dashboard)

    def _moved(self) -> None:
        """After every move: the inspector's finished requests are the moment's, and the
        dashboard draws now rather than at its next tick."""
        self.query_one(RequestInspector).restore(self.cursor.finished)
        self.dashboard.redraw()
        if self.dashboard.active_tab != "tab-blocks":
            self.dashboard.redraw_plots(force=True)
        self.query_one(ReplayBar).redraw()

    def _play_tick(self) -> None:
        now = time.monotonic()
        elapsed, self._played_at = now - self._played_at, now
        if self.cursor.playing:
            before = self.cursor.index
            self.cursor.tick(elapsed)
            if self.cursor.index != before:
                self._moved()
            else:
                self.query_one(ReplayBar).redraw()

    def action_play_pause(self) -> None:
        self.cursor.toggle_play()
        self._played_at = time.monotonic()
        self._moved()

    def action_step(self, snapshots: int) -> None:
        self.cursor.step(snapshots)
        self._moved()

    def action_skip(self, seconds: float) -> None:
        self.cursor.skip(seconds)
        self._moved()

    def action_to_start(self) -> None:
        self.cursor.seek_index(0)
        self._moved()

    def action_to_end(self) -> None:
        self.cursor.seek_index(len(self.cursor.times) - 1)
        self._moved()

    def action_faster(self) -> None:
        self.cursor.faster()
        self.query_one(ReplayBar).redraw()

    def action_slower(self) -> None:
        self.cursor.slower()
        self.query_one(ReplayBar).redraw()

    def action_worst_ttft(self) -> None:
        worst = self.cursor.worst_ttft()
        if worst is None:
            self.notify("This recording has no first tokens (no TTFT).", severity="warning")
            return
        self.cursor.playing = False
        self.cursor.seek(worst.at)
        self._moved()
        self.dashboard.show_tab("tab-blocks")
        inspector = self.query_one(RequestInspector)
        inspector.select(worst.request_id)
        who = worst.request_id or "a request"
        self.notify(f"Worst TTFT: {worst.ttft_s * 1000:.0f} ms ({who})", timeout=5)

    def action_toggle_tab(self) -> None:
        tabs = ["tab-blocks", "tab-latency", "tab-spec"]
        dashboard = self.dashboard
        current = tabs.index(dashboard.active_tab) if dashboard.active_tab in tabs else -1
        dashboard.show_tab(tabs[(current + 1) % len(tabs)])
