"""Modal: confirm a deletion from the Models screen (what happens is spelled out)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmDeleteScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Delete", id="confirm_delete_yes"),
        Binding("n,escape", "answer(False)", "Keep", id="confirm_delete_no"),
    ]
    DEFAULT_CSS = """
    ConfirmDeleteScreen { align: center middle; }
    ConfirmDeleteScreen > Vertical {
        width: 72; max-width: 100%; height: auto; border: thick $error; background: $surface;
        padding: 0 1;
    }
    ConfirmDeleteScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmDeleteScreen Button { margin-left: 1; }
    """

    def __init__(self, question: str, detail: str = "The files are removed from disk.",
                 action: str = "Delete") -> None:
        super().__init__()
        self.question = question  # e.g. "Delete tiny-llama (1.2 MB)?"
        self.detail = detail
        self.action_label = action

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"{self.question}\n{self.detail}", id="confirm-text")
            with Horizontal():
                yield Button("Keep (n)", id="keep")
                yield Button(f"{self.action_label} (y)", id="delete", variant="error")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "delete")
