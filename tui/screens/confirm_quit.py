"""Modal: quitting would stop something still running (a reply, a load burst, a job)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmQuitScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y,ctrl+q", "answer(True)", "Quit", id="confirm_quit_yes"),
        Binding("n,escape", "answer(False)", "Stay", id="confirm_quit_no"),
    ]
    DEFAULT_CSS = """
    ConfirmQuitScreen { align: center middle; }
    ConfirmQuitScreen > Vertical {
        width: 64; max-width: 100%; height: auto; border: thick $warning; background: $surface;
        padding: 0 1;
    }
    ConfirmQuitScreen #quit-running { margin: 1 0; }
    ConfirmQuitScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmQuitScreen Button { margin-left: 1; }
    """

    def __init__(self, running: list[str]) -> None:
        super().__init__()
        self.running = running

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Quit kvdeck?", classes="title")
            yield Static("Still running: " + "; ".join(self.running) + ".\nQuitting stops "
                         "it: a partial reply stays in the saved chat, a cancelled job leaves "
                         "nothing behind.", id="quit-running")
            with Horizontal():
                yield Button("Stay (n)", id="stay")
                yield Button("Quit (y)", id="quit", variant="warning")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "quit")
