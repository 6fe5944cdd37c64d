"""The chat's message box: a TextArea that grows with what is typed or pasted.

A one-line Input keeps only the first line of a paste; here a pasted snippet arrives whole.
Enter sends; shift+enter and ctrl+j start a new line. Many terminals send shift+enter as a
plain Enter, so ctrl+j (a line feed in every terminal) is the one that always works. The
box is one line tall when empty and grows to MAX_VISIBLE_LINES (the height rule is in
kvdeck.tcss), then scrolls; clearing it after a send shrinks it back.
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

KEYS_LEFT_TO_THE_APP = ("redo", "select_line")  # TextArea actions whose keys kvdeck uses
MAX_VISIBLE_LINES = 8  # kvdeck.tcss: #prompt max-height is this plus the border's two rows


class ChatInput(TextArea):
    BINDINGS = [
        # One binding per key, each with its id: the help lists both, a keymap can move either.
        Binding("ctrl+j", "newline", "New line", id="chat_newline", show=False,
                tooltip="New line in the message (works in every terminal)"),
        Binding("shift+enter", "newline", "New line", id="chat_newline_shift", show=False,
                tooltip="New line in the message, where the terminal tells shift+enter from "
                        "Enter (many do not: use ctrl+j)"),
    ]

    class Submitted(Message):
        """Enter was pressed: `text` is the whole message, every line of it."""

        def __init__(self, chat_input: ChatInput, text: str) -> None:
            super().__init__()
            self.chat_input = chat_input
            self.text = text

        @property
        def control(self) -> ChatInput:
            return self.chat_input

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:
        # No cursor-line highlight: it is a message box, not an editor.
        super().__init__(placeholder=placeholder, id=id, soft_wrap=True, tab_behavior="focus",
                         highlight_cursor_line=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # TextArea binds ctrl+y (redo) and f6 (select the line); in kvdeck those keys copy
        # the last reply and move to the next server wherever the focus is. Refused here,
        # they go on to the screen's and the app's bindings.
        if action in KEYS_LEFT_TO_THE_APP:
            return False
        return super().check_action(action, parameters)

    async def _on_key(self, event: events.Key) -> None:
        # Enter and the new-line keys are acted on here, in the order the keys came. TextArea's
        # own _on_key (called after this one, along the class hierarchy, unless the default
        # is prevented) would insert a line break for Enter; and a binding runs only once
        # the key has bubbled up to the app, after the letters typed behind it were
        # inserted (a fast typist, a paste, tmux: the new line landed after them).
        if self.read_only:
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
        elif any(binding.action == "newline"
                 for binding in self._bindings.key_to_bindings.get(event.key, ())):
            event.stop()
            event.prevent_default()
            self.action_newline()

    def action_newline(self) -> None:
        if self.read_only:
            return
        self.replace("\n", *self.selection, maintain_selection_offset=False)

    def type_text(self, text: str) -> None:
        """Insert `text` at the cursor (replacing a selection), the cursor after it."""
        self.replace(text, *self.selection, maintain_selection_offset=False)
