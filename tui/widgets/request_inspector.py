"""The request inspector: the engine's requests in a table; the selected one in detail.

The selected request's reason line, timeline bar and TTFT parts sit above its detail
(request_timeline_bar.py). Requests that finished stay listed (dimmed, newest first among
them) for a while, so one that ended between two looks can still be selected; the detail
gives the block table all the lines it needs (it scrolls beyond that). The table works
from the keyboard (Tab to it, ↑↓ or j/k, Enter, Escape: see RequestTable) as well as with
the mouse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Static

from kvdeck.tui.request_colours import RequestColours
from kvdeck.tui.tier_cells import request_tiers_text
from kvdeck.tui.widgets.request_table import RequestTable
from kvdeck.tui.widgets.request_timeline_bar import RequestTimelineBar

if TYPE_CHECKING:
    from kvdeck.engine.types.spec_stats import RequestSpecStats
    from kvdeck.engine.types.stats import EngineStats, RequestStats

COLUMNS = (("id", "request", None), ("state", "state", 10), ("prompt", "prompt", None),
           ("done", "computed", None), ("out", "output", None), ("cached", "cached", None),
           ("blocks", "blocks", None))
KEEP_FINISHED = 6  # finished requests still listed
FINISHED = "finished"
NOTHING_SELECTED = ("Select a request to see its block table: Tab to the table, ↑↓ or j/k, "
                    "Enter; or click a block in the map.")


ADAPTER_COLOUR = "#3cb44b"


def with_final_figures(last: RequestStats, final: RequestStats) -> RequestStats:
    """A finished request's last snapshot with its final output's counts and timeline (its
    block table and cache figures stay the snapshot's: its blocks are freed by then)."""
    return replace(last, num_output_tokens=final.num_output_tokens,
                   num_computed_tokens=max(last.num_computed_tokens, final.num_computed_tokens),
                   timeline=final.timeline or last.timeline)


def block_table_text(request: RequestStats, colour: str, finished: bool = False) -> Text:
    text = Text()
    text.append(f"{request.request_id}", style=colour)
    state = FINISHED if finished else request.state
    text.append(f"  {state} · prompt {request.num_prompt_tokens} tok · computed "
                f"{request.num_computed_tokens} · output {request.num_output_tokens} · "
                f"prefix-cached {request.num_cached_tokens} tok")
    if request.constrained:  # structured outputs: held to a grammar
        compiled = ("compiling…" if request.grammar_compile_s is None
                    else f"compiled in {request.grammar_compile_s * 1000:.1f} ms")
        text.append(f" · constrained, grammar {compiled}", style="bold #911eb4")
    if request.lora_name is not None:  # a LoRA adapter's request (None: the base model)
        text.append(f" · LoRA adapter {request.lora_name}", style=f"bold {ADAPTER_COLOUR}")
    text.append("\n")
    text.append(request_tiers_text(request))  # prompt tokens by tier, swaps' cost (if any)
    if request.spec is not None and (request.spec.num_drafts or request.spec.decision):
        text.append(speculation_text(request.spec))
    if finished:
        text.append("finished: its blocks were freed (full ones stay in the prefix cache); "
                    "its last block table was:\n", style="italic")
    elif not request.block_table:
        text.append("no blocks (not scheduled, or preempted)", style="italic")
        return text
    text.append("logical→physical: ", style="bold")
    text.append("  ".join(f"{i}→{b}" for i, b in enumerate(request.block_table)))
    return text


def speculation_text(spec: RequestSpecStats) -> Text:
    """Speculative decoding for one request: its acceptance and the drafts accepted per
    verification step, newest last."""
    text = Text()
    text.append("speculative: ", style="bold")
    text.append(f"{spec.acceptance_rate:.0%} of {spec.num_draft_tokens} drafts accepted, "
                f"{spec.mean_accepted_length:.2f} per step over {spec.num_drafts} steps")
    if spec.paused:
        text.append(" · paused (poor recent acceptance)", style="italic")
    if spec.decision:  # the gain policy's, this step
        text.append("\npolicy: ", style="bold")
        text.append(spec.decision)
    text.append("\naccepted per step: ")
    text.append(" ".join(str(n) for n in spec.accepted_history[-24:]))
    text.append("\n")
    return text


class RequestInspector(Vertical):
    DEFAULT_CSS = """
    RequestInspector { height: 1fr; }
    RequestInspector DataTable { height: 1fr; min-height: 3; }
    RequestInspector #request-detail-scroll { height: auto; max-height: 10; min-height: 3; }
    RequestInspector #request-detail { height: auto; }
    """

    class Selected(Message):
        def __init__(self, request_id: str | None) -> None:
            self.request_id = request_id
            super().__init__()

    def __init__(self, colours: RequestColours | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.colours = colours or RequestColours()  # shared with the block map
        self.selected_id: str | None = None
        self._requests: dict[str, RequestStats] = {}
        self._finished: dict[str, RequestStats] = {}  # last seen state, oldest first
        self._ended_seen = 0  # the number of the last final figures applied (show's `ended`)
        self._ended_early: dict[str, RequestStats] = {}  # final, while a snapshot lists it still
        self._rows: dict[str, tuple] = {}  # the values drawn per row: redraw only what changed

    def compose(self) -> ComposeResult:
        table = RequestTable(id="request-table")
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        yield RequestTimelineBar(id="request-timeline")
        with VerticalScroll(id="request-detail-scroll"):
            yield Static(NOTHING_SELECTED, id="request-detail")

    @property
    def table(self) -> RequestTable:
        return self.query_one(RequestTable)

    def show(self, stats: EngineStats, ended: Iterable[tuple[int, RequestStats]] = ()) -> None:
        """Draw a snapshot; `ended` (DashboardState.ended) holds numbered final figures of
        finished requests, which replace the last snapshot's figures of each (a request never
        seen in a snapshot is listed with them alone)."""
        table = self.table
        under_cursor = table.cursor_request  # rows move below: the cursor stays on it
        current = {r.request_id: r for r in stats.requests}
        for rid, request in self._requests.items():  # just finished: kept, dimmed
            if rid not in current:
                self._finished.pop(rid, None)
                final = self._ended_early.pop(rid, None)
                self._finished[rid] = request if final is None else with_final_figures(request, final)
        for number, final in ended:
            if number <= self._ended_seen:
                continue
            self._ended_seen = number
            rid = final.request_id
            if rid in current:  # this snapshot was taken before it ended
                self._ended_early[rid] = final
                continue
            last = self._finished.pop(rid, None)
            self._finished[rid] = final if last is None else with_final_figures(last, final)
        for rid in [rid for rid in self._ended_early if rid not in current]:
            del self._ended_early[rid]  # gone without a snapshot between (applied above or lost)
        for rid in [rid for rid in self._finished if rid in current]:
            del self._finished[rid]  # the same id again (a restarted engine)
        while len(self._finished) > KEEP_FINISHED:
            self._finished.pop(next(iter(self._finished)))
        for gone in [rid for rid in self._rows if rid not in current and rid not in self._finished]:
            table.remove_row(gone)
            del self._rows[gone]
        rows_before = table.row_count
        added = any(rid not in self._rows for rid in current)
        for rid, request in current.items():
            self._draw_row(table, rid, request, finished=False)
        for rid, request in self._finished.items():
            self._draw_row(table, rid, request, finished=True)
        if added or table.row_count != rows_before:  # running requests above finished ones
            table.sort("state", key=lambda state: str(state) == FINISHED)
        table.keep_cursor_on(under_cursor)
        self._requests = current
        self._show_detail()

    def restore(self, finished: list[RequestStats]) -> None:
        """Replay moved (kvdeck replay): the requests that had finished by the new moment,
        oldest first, replace those this inspector saw finish; show() then draws the moment."""
        self._requests = {}
        self._finished = {r.request_id: r for r in finished[-KEEP_FINISHED:]}

    def _draw_row(self, table: DataTable, rid: str, request: RequestStats, finished: bool) -> None:
        state = FINISHED if finished else request.state
        values = (state, request.num_prompt_tokens, request.num_computed_tokens,
                  request.num_output_tokens, request.num_cached_tokens, len(request.block_table))
        drawn = self._rows.get(rid)
        if drawn == values:
            return
        if drawn is not None and finished != (drawn[0] == FINISHED):
            table.remove_row(rid)  # restyled as a whole when it finishes
            drawn = None
        style = "dim" if finished else ""
        if drawn is None:
            cells = [Text(str(v), style=style) for v in values]
            label = Text(rid, style=f"{self.colours.colour(rid)} {style}".strip())
            if request.lora_name is not None:
                label.append(f" [{request.lora_name}]", style=f"{ADAPTER_COLOUR} {style}".strip())
            table.add_row(label, *cells, key=rid)
        else:
            for (key, _, _), value, old in zip(COLUMNS[1:], values, drawn, strict=True):
                if value != old:
                    table.update_cell(rid, key, Text(str(value), style=style), update_width=True)
        self._rows[rid] = values

    def select(self, request_id: str | None) -> None:
        """Select a request (e.g. clicked in the map); None clears the selection."""
        table = self.table
        if request_id is not None and request_id in self._rows:
            table.move_cursor(row=table.get_row_index(request_id))
        self._set_selected(request_id)

    def _set_selected(self, request_id: str | None) -> None:
        if request_id != self.selected_id:
            self.selected_id = request_id
            self.post_message(self.Selected(request_id))
        self._show_detail()

    def _show_detail(self) -> None:
        detail = self.query_one("#request-detail", Static)
        timeline = self.query_one(RequestTimelineBar)
        rid = self.selected_id
        if rid is None:
            timeline.show(None)
            detail.update(NOTHING_SELECTED)
            return
        request = self._requests.get(rid)
        if request is not None:
            timeline.show(request)
            detail.update(block_table_text(request, self.colours.colour(rid)))
        elif rid in self._finished:
            timeline.show(self._finished[rid], finished=True)
            detail.update(block_table_text(self._finished[rid], self.colours.colour(rid), True))
        else:
            timeline.show(None)
            detail.update(Text(f"{rid} has finished.", style="italic"))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._set_selected(event.row_key.value)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self.table.has_focus:  # moved by the keys: the inspector follows
            self._set_selected(event.row_key.value)
