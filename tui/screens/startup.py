"""Shown over the deck while the engine process starts: one line per stage, a progress bar."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, ProgressBar, Static

from kvdeck.tui.engine_protocol import STARTUP_STAGES


class StartupScreen(ModalScreen[None]):
    # A modal screen hides the app's bindings: quitting must still work while loading.
    BINDINGS = [Binding("q", "app.quit", "Quit", id="startup_quit")]

    DEFAULT_CSS = """
    StartupScreen { align: center middle; }
    StartupScreen > Vertical {
        width: 64; max-width: 95%; height: auto; padding: 1 2;
        border: thick $primary; background: $surface;
    }
    StartupScreen #startup-title { text-style: bold; margin-bottom: 1; }
    StartupScreen ProgressBar { margin: 1 0; }
    StartupScreen #startup-log { height: auto; color: $text-muted; }
    """

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self.model_name = model_name
        self.stages_seen: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Starting the engine · {self.model_name}", id="startup-title")
            yield Static("starting the engine process…", id="startup-stage")
            yield ProgressBar(total=len(STARTUP_STAGES) - 1, show_eta=False, id="startup-bar")
            yield Static("", id="startup-log")

    def advance(self, stage: str, message: str) -> None:
        """Show one StartupProgress report (stages may repeat with new messages)."""
        if stage in STARTUP_STAGES:
            self.query_one(ProgressBar).update(progress=STARTUP_STAGES.index(stage))
        self.query_one("#startup-stage", Static).update(f"{stage}: {message}")
        self.stages_seen.append(stage)
        # The stages so far, once each (a stage may report several messages).
        self.query_one("#startup-log", Static).update(" → ".join(dict.fromkeys(self.stages_seen)))
