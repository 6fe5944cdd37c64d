"""Shown when the engine fails to start or dies: the reason, and restart or quit."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Label, Static

from kvdeck.tui.messages import RestartEngineRequested


class EngineErrorScreen(Screen[None]):
    BINDINGS = [
        Binding("r", "restart", "Restart engine", id="restart_engine"),
        Binding("q", "app.quit", "Quit", id="error_quit"),
    ]

    DEFAULT_CSS = """
    EngineErrorScreen { align: center middle; }
    EngineErrorScreen > Vertical {
        width: 90; max-width: 100%; height: auto; max-height: 100%; padding: 1 2;
        border: thick $error; background: $surface;
    }
    EngineErrorScreen #error-title { text-style: bold; color: $error; }
    EngineErrorScreen #error-detail { height: auto; max-height: 12; margin: 1 0; }
    EngineErrorScreen Horizontal { height: auto; }
    EngineErrorScreen Button { margin-right: 2; }
    """

    def __init__(self, title: str, detail: str) -> None:
        super().__init__()
        self.title_text = title
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="error-title")
            with VerticalScroll(id="error-detail"):
                yield Static(self.detail, markup=False)
            yield Static("Your chat is saved. Restart the engine, or quit and check the model "
                         "and flags (kvdeck --help).")
            with Horizontal():
                yield Button("Restart engine (r)", variant="primary", id="restart")
                yield Button("Quit (q)", variant="error", id="quit")
        yield Footer()

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "restart":
            self.action_restart()
        else:
            await self.app.action_quit()

    def action_restart(self) -> None:
        self.post_message(RestartEngineRequested())
