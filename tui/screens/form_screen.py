"""A modal form: Enter in any of its inputs or its submit button submits, the other button
or escape cancels (dismissing None). The settings, engine-settings and load-generator
dialogs are such forms; each says what submitting does (`submit`) and shows a refused
value under its fields instead of closing."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Button, Input

ResultT = TypeVar("ResultT")


class FormScreen(ModalScreen[ResultT | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="form_cancel")]
    SUBMIT_BUTTON: ClassVar[str] = "save"  # the id of the button that submits

    def submit(self) -> None:
        raise NotImplementedError

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == self.SUBMIT_BUTTON:
            self.submit()
        else:
            self.action_cancel()
