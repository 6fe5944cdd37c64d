"""The models screen's panel for the running task: a download, a quantise job (its status
named after its method, AWQ or RTN) or a comparison.

Shows total progress (bar, bytes, speed, ETA), the current file or layer, and the outcome
(a clear error, or what was registered). The screen feeds it; it holds no logic.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, ProgressBar, Static

from kvdeck.app.jobs.compare import CompareProgress
from kvdeck.app.jobs.quantize import QuantizeProgress
from kvdeck.app.store.download_progress import DownloadProgress, format_bytes, format_eta
from kvdeck.quant.progress_text import format_duration, format_remaining


class ModelTaskPanel(Vertical):
    DEFAULT_CSS = """
    ModelTaskPanel { height: auto; border: round $primary; padding: 0 1; display: none; }
    ModelTaskPanel.-active, ModelTaskPanel.-outcome { display: block; }
    ModelTaskPanel #task-title { text-style: bold; }
    ModelTaskPanel #task-bar-row { height: 1; }
    ModelTaskPanel ProgressBar { width: 1fr; }
    ModelTaskPanel #task-cancel { min-width: 10; height: 1; border: none; margin-left: 1; }
    ModelTaskPanel #task-files { height: auto; max-height: 4; color: $text-muted; }
    ModelTaskPanel.-error #task-status { color: $error; }
    """

    def compose(self) -> ComposeResult:
        yield Label("", id="task-title")
        with Horizontal(id="task-bar-row"):
            yield ProgressBar(total=100, show_eta=False, id="task-bar")
            yield Button("Cancel", id="task-cancel", variant="error", compact=True)
        yield Static("", id="task-status")
        yield Static("", id="task-files")

    def start(self, title: str) -> None:
        self.set_classes("-active")
        self.query_one("#task-title", Label).update(title)
        self.query_one("#task-bar", ProgressBar).update(total=100, progress=0)
        self.query_one("#task-cancel", Button).display = True
        self._status("starting…")
        self.query_one("#task-files", Static).update("")

    def show_download(self, p: DownloadProgress) -> None:
        self.query_one("#task-bar", ProgressBar).update(total=100, progress=100 * p.fraction)
        self._status(
            f"{p.phase} · {format_bytes(p.done_bytes)} of {format_bytes(p.total_bytes)}"
            f" · {format_bytes(p.speed_bps)}/s · ETA {format_eta(p.eta_s)}"
        )
        lines = []
        for f in p.files:
            if f.state in ("downloading", "verifying"):
                pct = 100 * f.done / f.size if f.size else 100
                lines.append(f"{f.state} {f.name}  {format_bytes(f.done)}/{format_bytes(f.size)}"
                             f" ({pct:.0f}%)")  # fmt: skip
        finished = sum(f.state == "done" for f in p.files)
        lines.append(f"{finished} of {len(p.files)} files done")
        self.query_one("#task-files", Static).update("\n".join(lines))

    def show_quantize(self, p: QuantizeProgress) -> None:
        self.query_one("#task-bar", ProgressBar).update(total=100, progress=100 * p.fraction)
        if p.phase == "quantizing":
            self._status(f"{p.method_name} · {p.message or 'starting'} · {format_duration(p.elapsed_s)}"
                         f" elapsed · {format_remaining(p.eta_s)}")  # fmt: skip
        else:
            self._status(f"{p.method_name} · {p.message or p.phase}")

    def show_compare(self, p: CompareProgress) -> None:
        self.query_one("#task-bar", ProgressBar).update(total=100, progress=100 * p.fraction)
        self._status(p.message)

    def show_message(self, message: str) -> None:
        self._status(message)

    def finish(self, message: str, error: bool = False, complete: bool = False) -> None:
        """The outcome; `complete`: the task did all its work, so the bar ends full."""
        self.set_classes("-outcome -error" if error else "-outcome")
        self.query_one("#task-cancel", Button).display = False
        if complete:
            self.query_one("#task-bar", ProgressBar).update(total=100, progress=100)
        self._status(message)

    @property
    def percent(self) -> float:
        bar = self.query_one("#task-bar", ProgressBar)
        return 100 * (bar.progress / bar.total) if bar.total else 0.0

    @property
    def status_text(self) -> str:
        return str(self.query_one("#task-status", Static).content)

    def _status(self, text: str) -> None:
        self.query_one("#task-status", Static).update(text)
