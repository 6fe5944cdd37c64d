"""The app `kvdeck replay FILE` runs: one ReplayScreen on a recording, the same dashboard
widgets as the live app, fed by a ReplayCursor instead of an engine (nothing is started,
nothing can be sent)."""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

from textual.app import App
from textual.binding import Binding

from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.replay_cursor import ReplayCursor
from kvdeck.tui.screens.help import HelpScreen
from kvdeck.tui.screens.replay import ReplayScreen

if TYPE_CHECKING:
    from kvdeck.app.record.reader import Recording


class ReplayApp(App[int]):
    TITLE = "kvdeck replay"
    CSS_PATH = str(files("kvdeck.tui").joinpath("styles", "kvdeck.tcss"))

    BINDINGS = [
        Binding("f1", "help", "Help", id="help", tooltip="Show the keys and the map legend"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", id="toggle_theme", show=False,
                tooltip="Switch between the light and dark theme"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True,
                tooltip="Close the replay"),
        Binding("ctrl+c", "quit", "Quit", id="quit_ctrl_c", priority=True, show=False,
                tooltip="Close the replay"),
    ]

    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording
        self.dashboard_state = DashboardState(source_label=f"recording {recording.path.name}")
        self.dashboard_state.max_model_len = recording.engine.max_model_len
        self.cursor = ReplayCursor(recording, self.dashboard_state)

    def get_default_screen(self) -> ReplayScreen:
        return ReplayScreen(self.cursor)

    def on_mount(self) -> None:
        engine = self.recording.engine
        cut = "" if self.recording.complete else " (cut short)"
        self.sub_title = f"{self.recording.path.name}{cut} · {engine.model or 'unknown model'}"

    @property
    def replay(self) -> ReplayScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, ReplayScreen)
        return screen

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        screen = self.replay
        groups = [("Everywhere", [b for b in self.BINDINGS if isinstance(b, Binding)]),
                  ("Replay", [b for b in screen.BINDINGS if isinstance(b, Binding)]),
                  *screen.HELP_GROUPS]
        self.push_screen(HelpScreen(groups))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"
