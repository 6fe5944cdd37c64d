"""One chat message: role, body, and the reply's figures.

A reply's body is Markdown (streamed as it arrives). The user's message is shown as typed,
line for line: Markdown would join its lines into one paragraph and eat the indentation of
pasted code."""

from __future__ import annotations

import re

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Markdown, Static

_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def displayable(text: str) -> str:
    """Model text with control characters (a random model emits them) shown as U+FFFD: they
    would corrupt the terminal and make screenshots invalid XML. The raw text is kept."""
    return _CONTROL_CHARS.sub("\ufffd", text.replace("\r", ""))


class ChatMessage(Vertical, can_focus=True):
    BINDINGS = [
        Binding("c", "copy", "Copy message", id="copy_message"),
    ]

    DEFAULT_CSS = """
    ChatMessage { height: auto; padding: 0 1; margin: 0 0 1 0; }
    ChatMessage .role { text-style: bold; height: 1; }
    ChatMessage Markdown { margin: 0; padding: 0; }
    ChatMessage .user-text { height: auto; }
    ChatMessage .thinking { color: $text-muted; text-style: italic; height: auto;
                            border-left: outer $secondary; padding: 0 1; }
    ChatMessage .thinking.-empty { display: none; }
    ChatMessage .reply-stats { color: $text-muted; height: auto; }
    ChatMessage.-error .reply-stats { color: $error; }
    """

    def __init__(self, role: str, content: str = "", stats: str = "", thinking: str = "") -> None:
        super().__init__(classes=f"-{role}" + (" -error" if "· error:" in stats else ""))
        self.role = role
        self.content = content
        self.stats = stats
        self.thinking = thinking

    def compose(self) -> ComposeResult:
        label = {"user": "You", "assistant": "Assistant"}.get(self.role, self.role)
        yield Static(label, classes="role")
        if self.role == "user":
            yield Static(displayable(self.content), markup=False, classes="user-text")
        else:
            yield Static(displayable(self.thinking), markup=False,
                         classes="thinking" + ("" if self.thinking else " -empty"))
            yield Markdown(displayable(self.content))
        yield Static(self.stats, classes="reply-stats")

    def add_thinking(self, text: str) -> None:
        """More of a thinking model's reasoning, shown dimmed above the reply."""
        self.thinking += text
        shown = self.query_one(".thinking", Static)
        shown.update(displayable(self.thinking))
        shown.remove_class("-empty")

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    def set_stats(self, stats: str, error: bool = False) -> None:
        """The figures under a reply; `error`: it ended in an error, shown as one."""
        self.stats = stats
        self.set_class(error, "-error")
        self.query_one(".reply-stats", Static).update(stats)

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.notify("Message copied to the clipboard.", timeout=2)
