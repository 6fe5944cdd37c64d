"""The attached servers, one row each and a summed row: what their /metrics say.

Gauges as they are, rates and latency percentiles over the last window (computed from the
histograms as Prometheus' histogram_quantile does). A disconnected server keeps its last
figures, greyed, with the reason and the next retry beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

if TYPE_CHECKING:
    from kvdeck.app.attach.metrics_view import MetricsView
    from kvdeck.tui.attached_servers import AttachedServers, ServerRow

COLUMNS = ("server", "engine", "state", "KV", "running", "waiting", "gen tok/s",
           "prefix hit", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "e2e p50", "queue p50",
           "spec accept")
GREY = "#7a7a7a"
SUM_KEY = "sum"


def _ms(view: MetricsView | None, name: str, q: float) -> str:
    value = None if view is None else view.latencies.get(name, {}).get(q)
    return "–" if value is None else f"{value * 1000:.0f} ms"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def figures(view: MetricsView | None) -> list[str]:
    """The metric columns of one row (everything after server, engine and state)."""
    if view is None:
        return ["–"] * (len(COLUMNS) - 3)
    return [
        _pct(view.kv_cache_usage), _num(view.num_running), _num(view.num_waiting),
        _num(view.generation_tokens_per_s, 1), _pct(view.prefix_cache_hit_rate),
        _ms(view, "ttft", 0.5), _ms(view, "ttft", 0.99), _ms(view, "itl", 0.5),
        _ms(view, "itl", 0.99), _ms(view, "e2e", 0.5), _ms(view, "queue", 0.5),
        _pct(view.spec_acceptance_rate),
    ]


def row_cells(row: ServerRow) -> list[Text]:
    state = {"ready": "connected", "dead": "disconnected", "starting": "connecting"}.get(
        row.status, row.status)
    cells = [("▶ " if row.selected else "  ") + row.url, row.engine, state, *figures(row.view)]
    style = "" if row.connected else GREY
    return [Text(cell, style=style) for cell in cells]


class ServerTable(Vertical):
    DEFAULT_CSS = """
    ServerTable { height: 1fr; }
    ServerTable DataTable { height: auto; max-height: 60%; }
    ServerTable #server-detail { height: auto; margin-top: 1; }
    """

    def __init__(self, servers: AttachedServers, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.servers = servers
        self._drawn: dict[str, tuple] = {}

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="server-rows")
        for label in COLUMNS:
            table.add_column(label, key=label)
        yield table
        yield Static(id="server-detail")

    def show(self) -> None:
        """Redraw the rows whose figures changed; a summed row once there are several."""
        table = self.query_one(DataTable)
        rows = self.servers.rows()
        wanted: dict[str, list[Text]] = {row.url: row_cells(row) for row in rows}
        if len(rows) > 1:
            summed = self.servers.summed()
            connected = sum(row.connected for row in rows)
            label = f"  all {len(rows)} servers ({connected} connected)"
            wanted[SUM_KEY] = [Text(label, style="bold"), Text("sum"), Text(""),
                               *(Text(cell, style="bold") for cell in figures(summed))]
        for key in list(self._drawn):
            if key not in wanted:
                table.remove_row(key)
                del self._drawn[key]
        for key, cells in wanted.items():
            drawn = tuple((cell.plain, str(cell.style)) for cell in cells)
            if key not in self._drawn:
                table.add_row(*cells, key=key)
            elif drawn != self._drawn[key]:
                for column, cell in zip(COLUMNS, cells):
                    table.update_cell(key, column, cell, update_width=True)
            self._drawn[key] = drawn
        problems = [f"{row.url}: {row.detail}" for row in rows if not row.connected]
        detail = Text("\n".join(problems), style=GREY) if problems else Text(
            "Figures over the last ~30 s of each server's /metrics; the summed row merges "
            "the histograms.", style="italic")
        self.query_one("#server-detail", Static).update(detail)
