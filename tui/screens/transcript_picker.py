"""Modal: pick a saved chat transcript to reopen."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from kvdeck.tui.transcripts import Transcript


class TranscriptPickerScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="picker_cancel")]

    DEFAULT_CSS = """
    TranscriptPickerScreen { align: center middle; }
    TranscriptPickerScreen > Vertical {
        width: 80; max-width: 100%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    TranscriptPickerScreen OptionList { height: auto; max-height: 20; }
    """

    def __init__(self, transcripts: list[Transcript]) -> None:
        super().__init__()
        self.transcripts = transcripts

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.transcripts:
                yield Label("Reopen a chat (Enter opens, Esc cancels)")
            else:
                yield Label("No saved chats yet. Esc closes.")
            yield OptionList(*(
                Option(f"{t.created[:16].replace('T', ' ')}  {t.title}  ({len(t.turns)} messages)",
                       id=t.id)
                for t in self.transcripts
            ))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
