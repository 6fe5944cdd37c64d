"""Modal: ask for a path (a model folder to add, a text file to evaluate on), checked inline."""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

# The path typed -> a reason it will not do, or None when it is fine.
PathCheck = Callable[[str], str | None]


class PathPromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path_prompt_cancel")]
    DEFAULT_CSS = """
    PathPromptScreen { align: center middle; }
    PathPromptScreen > Vertical {
        width: 80; max-width: 100%; height: auto; border: thick $primary; background: $surface;
        padding: 0 1;
    }
    PathPromptScreen #path-error { color: $error; height: auto; }
    PathPromptScreen Horizontal { height: auto; align-horizontal: right; }
    PathPromptScreen Button { margin-left: 1; }
    """

    def __init__(self, title: str, explanation: str, check: PathCheck, *, value: str = "",
                 placeholder: str = "", action: str = "OK") -> None:
        super().__init__()
        self.title_text = title
        self.explanation = explanation
        self.check = check
        self.value = value
        self.placeholder = placeholder
        self.action_label = action

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="title")
            yield Static(self.explanation)
            yield Input(self.value, placeholder=self.placeholder, id="path-input",
                        select_on_focus=False)
            yield Static("", id="path-error")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button(self.action_label, variant="primary", id="ok")

    def action_submit(self) -> None:
        path = self.query_one("#path-input", Input).value.strip()
        problem = "Type a path" if not path else self.check(path)
        if problem:
            self.query_one("#path-error", Static).update(problem)
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.action_submit()
        else:
            self.action_cancel()
