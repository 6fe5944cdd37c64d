"""The request inspector: the engine's requests in a table; the selected one in detail."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from kvdeck.tui.block_cells import PALETTE, request_colour_index

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats, RequestStats

COLUMNS = (("id", "request"), ("state", "state"), ("prompt", "prompt"), ("done", "computed"),
           ("out", "output"), ("cached", "cached"), ("blocks", "blocks"))


def block_table_text(request: RequestStats) -> Text:
    text = Text()
    text.append(f"{request.request_id}", style=PALETTE[request_colour_index(request.request_id)])
    text.append(f"  {request.state} · prompt {request.num_prompt_tokens} tok · computed "
                f"{request.num_computed_tokens} · output {request.num_output_tokens} · "
                f"prefix-cached {request.num_cached_tokens} tok\n")
    if not request.block_table:
        text.append("no blocks (not scheduled, or preempted)", style="italic")
        return text
    text.append("logical→physical: ", style="bold")
    text.append("  ".join(f"{i}→{b}" for i, b in enumerate(request.block_table)))
    return text


class RequestInspector(Vertical):
    DEFAULT_CSS = """
    RequestInspector { height: 1fr; }
    RequestInspector DataTable { height: 1fr; min-height: 3; }
    RequestInspector #request-detail { height: auto; max-height: 8; overflow-y: auto; }
    """

    class Selected(Message):
        def __init__(self, request_id: str | None) -> None:
            self.request_id = request_id
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.selected_id: str | None = None
        self._requests: dict[str, RequestStats] = {}
        self._rows: dict[str, tuple] = {}  # the values drawn per row: redraw only what changed

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="request-table")
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield Static("Select a request to see its block table.", id="request-detail")

    def show(self, stats: EngineStats) -> None:
        table = self.query_one(DataTable)
        current = {r.request_id: r for r in stats.requests}
        for gone in [rid for rid in self._rows if rid not in current]:
            table.remove_row(gone)
            del self._rows[gone]
        for rid, request in current.items():
            values = (request.state, request.num_prompt_tokens, request.num_computed_tokens,
                      request.num_output_tokens, request.num_cached_tokens,
                      len(request.block_table))
            drawn = self._rows.get(rid)
            if drawn is None:
                table.add_row(Text(rid, style=PALETTE[request_colour_index(rid)]), *values,
                              key=rid)
            elif drawn != values:
                for (key, _), value, old in zip(COLUMNS[1:], values, drawn, strict=True):
                    if value != old:
                        table.update_cell(rid, key, value)
            self._rows[rid] = values
        self._requests = current
        self._show_detail()

    def select(self, request_id: str | None) -> None:
        """Select a request (e.g. clicked in the map); None clears the selection."""
        table = self.query_one(DataTable)
        if request_id is not None and request_id in self._requests:
            table.move_cursor(row=table.get_row_index(request_id))
        self._set_selected(request_id)

    def _set_selected(self, request_id: str | None) -> None:
        if request_id != self.selected_id:
            self.selected_id = request_id
            self.post_message(self.Selected(request_id))
        self._show_detail()

    def _show_detail(self) -> None:
        detail = self.query_one("#request-detail", Static)
        request = self._requests.get(self.selected_id) if self.selected_id else None
        if request is None:
            if self.selected_id is not None:
                detail.update(Text(f"{self.selected_id} has finished.", style="italic"))
            else:
                detail.update("Select a request to see its block table.")
            return
        detail.update(block_table_text(request))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._set_selected(event.row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self.query_one(DataTable).has_focus:
            self._set_selected(event.row_key.value)
