"""Lines made of parts (a legend's entries, a tier's figures) that break between parts at the
widget's width, never inside one: `· a cell is 16 tokens` stays whole on the next line
instead of leaving `· a` behind. A part wider than the whole line wraps on a line of its
own."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget


def flow(rows: Sequence[Sequence[Text]], width: int, sep: str = "  ", indent: int = 0) -> Text:
    """Each row's parts joined by `sep`, a new line (indented `indent` cells) wherever the
    next part would not fit in `width` cells; rows are separated by new lines."""
    text = Text()
    for r, parts in enumerate(rows):
        if r:
            text.append("\n")
        used = 0
        for i, part in enumerate(parts):
            if i and used + len(sep) + part.cell_len > width:
                text.append("\n" + " " * indent)
                used = indent
            elif i:
                text.append(sep)
                used += len(sep)
            text.append_text(part)
            used += part.cell_len
    return text


class FlowText(Widget):
    """Rows of parts flowed to the widget's width; `set_rows` replaces them."""

    DEFAULT_CSS = "FlowText { height: auto; }"

    def __init__(self, rows: Sequence[Sequence[Text]] = (), sep: str = "  ", indent: int = 0,
                 *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows = [list(parts) for parts in rows]
        self.sep = sep
        self.indent = indent

    def set_rows(self, rows: Sequence[Sequence[Text]]) -> None:
        rows = [list(parts) for parts in rows]
        if rows != self.rows:  # the dashboard sets them on every redraw
            self.rows = rows
            self.refresh(layout=True)

    def flowed(self, width: int) -> Text:
        return flow(self.rows, max(1, width), self.sep, self.indent)

    def render(self) -> Text:
        return self.flowed(self.content_size.width)

    def get_content_height(self, container, viewport, width: int) -> int:
        # The lines the width gives (and any part wider than it wraps onto): layout and
        # render flow the same rows at the same width.
        if not self.rows:
            return 0
        return len(self.flowed(width).wrap(self.app.console, max(1, width)))
