"""The request inspector's table of requests, driven from the keyboard as well as the mouse.

Tab reaches it; ↑↓ (or j/k) move through the requests and the inspector follows the cursor;
Enter shows (pins) the request under the cursor, which stays selected when the focus leaves;
Escape hands the focus back to the chat input. Rows are re-sorted as requests start and
finish: the cursor stays on the request it was on, not on the row number.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.geometry import Size
from textual.widgets import DataTable

from kvdeck.tui.messages import ChatFocusRequested


class RequestTable(DataTable):
    BINDINGS = [
        Binding("enter", "select_cursor", "Show request", id="inspect_request",
                tooltip="Show the request under the cursor: its block table below, its blocks "
                        "highlighted in the map"),
        Binding("j", "cursor_down", "Next request", id="next_request", show=False,
                tooltip="Next request (or ↓); the inspector follows"),
        Binding("k", "cursor_up", "Previous request", id="previous_request", show=False,
                tooltip="Previous request (or ↑); the inspector follows"),
        Binding("escape", "leave", "Back to chat", id="leave_request_table",
                tooltip="Leave the table (the request stays selected): back to the chat input"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)

    def watch_virtual_size(self, old: Size, new: Size) -> None:
        # DataTable measures new rows when idle but keeps the lines it drew before, cached
        # under keys the measuring leaves as they were: once the columns widen, rows that do
        # not change again stay cut at the old widths ("chat-1a2b" as "chat-1a"). Redraw.
        if new.width != old.width:
            clear = getattr(self, "_clear_caches", None)  # DataTable's own (private)
            if clear is not None:
                clear()

    @property
    def cursor_request(self) -> str | None:
        """The id of the request under the cursor (None: the table is empty)."""
        if not self.is_valid_row_index(self.cursor_row):
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    def keep_cursor_on(self, request_id: str | None) -> None:
        """Put the cursor back on `request_id` after rows moved (a sort, a removal)."""
        if request_id is None or request_id not in self.rows:
            return
        row = self.get_row_index(request_id)
        if row != self.cursor_row:
            self.move_cursor(row=row, animate=False)

    def action_leave(self) -> None:
        self.post_message(ChatFocusRequested())
