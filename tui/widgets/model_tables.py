"""Tables of the models screen: local models (with incomplete downloads) and recommended ones.

Rows are keyed by the model's name / repo id, so the screen acts on `selected_key()`.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from kvdeck.app.store.download_progress import format_bytes
from kvdeck.app.store.inspect import InvalidModelError, read_config
from kvdeck.app.store.local_models import LocalModel, PendingDownload
from kvdeck.app.store.recommended import (
    RecommendedModel,
    format_params,
    local_memory_estimate,
    memory_estimate,
    num_parameters,
)

PENDING_PREFIX = "pending:"


class _KeyedTable(DataTable):
    def selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    def _restore_cursor(self, key: str | None) -> None:
        if key is None:
            return
        try:
            self.move_cursor(row=self.get_row_index(key))
        except Exception:  # noqa: BLE001 - the row is gone; keep the default cursor
            pass


class LocalModelsTable(_KeyedTable):
    # Single letters act only here, where the table has focus: typed elsewhere they are
    # text (the screen sends stray keys to its input).
    BINDINGS = [
        Binding("l,enter", "screen.load", "Load (or resume a download)", id="models_load"),
        Binding("a", "screen.quantize", "Quantise AWQ", id="models_quantize"),
        Binding("e", "screen.compare", "Compare", id="models_compare"),
        Binding("x,delete", "screen.delete", "Delete", id="models_delete"),
    ]
    COLUMNS = ("Name", "Architecture", "Params", "Dtype", "Quant", "Size", "Needs", "kvdeck",
               "Source")  # fmt: skip

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*self.COLUMNS)

    def show(self, models: list[LocalModel], pending: list[PendingDownload],
             free_gpu_bytes: int | None = None, context_tokens: int = 8192) -> None:  # fmt: skip
        keep = self.selected_key()
        self.clear()
        for m in models:
            supported = Text("yes", style="green") if m.supported else Text("no", style="red")
            self.add_row(m.name, m.architecture, format_params(m.num_params), m.dtype,
                         m.quantization or "-", format_bytes(m.size_bytes),
                         _needs(m, free_gpu_bytes, context_tokens), supported,
                         m.source + ("" if m.verified else " (unverified)"),
                         key=m.name)  # fmt: skip
        for p in pending:
            self.add_row(Text(p.repo_id, style="dim"), "", "", "", "", format_bytes(p.bytes_on_disk),
                         "", "", Text("incomplete: enter resumes", style="yellow"),
                         key=PENDING_PREFIX + p.repo_id)  # fmt: skip
        self._restore_cursor(keep)


def _needs(model: LocalModel, free_gpu_bytes: int | None, context_tokens: int) -> Text:
    """GPU memory to serve one `context_tokens` sequence; red when more than is free."""
    try:
        config = read_config(model.path)
    except InvalidModelError:
        return Text("?", style="dim")
    total = local_memory_estimate(config, model.size_bytes, context_tokens).total_bytes
    style = "red" if free_gpu_bytes is not None and total > free_gpu_bytes else ""
    return Text(format_bytes(total), style=style)


class RecommendedTable(_KeyedTable):
    BINDINGS = [
        Binding("p,enter", "screen.pull", "Download", id="recommended_pull"),
    ]
    COLUMNS = ("Repo", "Params", "Quant", "Weights", "Needs", "Fits", "")

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*self.COLUMNS)

    def show(self, models: tuple[RecommendedModel, ...], free_gpu_bytes: int | None,
             context_tokens: int) -> None:  # fmt: skip
        keep = self.selected_key()
        self.clear()
        for r in models:
            est = memory_estimate(r, context_tokens)
            if free_gpu_bytes is None:
                fits = Text("?", style="dim")
            elif est.total_bytes <= free_gpu_bytes:
                fits = Text("yes", style="green")
            else:
                fits = Text("no", style="red")
            self.add_row(r.repo_id, format_params(num_parameters(r.arch)), r.quantization or "-",
                         format_bytes(est.weight_bytes), format_bytes(est.total_bytes), fits,
                         "gated" if r.gated else "", key=r.repo_id)  # fmt: skip
        self._restore_cursor(keep)
