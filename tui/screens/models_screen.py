"""The Models screen: local models, recommended ones, download, quantise, load, delete.

Self-contained: the app passes the services it owns (the engine session, the activity
tracker, how much GPU memory is free) to the constructor; loading a model is a message
(SwitchModelRequested) the app acts on. Downloads run in a thread worker, quantise jobs in
their own process (kvdeck.app.jobs); both report here through `call_from_thread`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Input, Label, Static

from kvdeck.app.jobs.compare import CompareJob, start_compare
from kvdeck.app.jobs.quantize import QuantizeJob, QuantizeOptions, QuantizeProgress, start_quantize
from kvdeck.app.store import local_models, paths
from kvdeck.app.store.download import CancelToken, DownloadError, download_model
from kvdeck.app.store.download_progress import DownloadCancelled, DownloadProgress, format_bytes
from kvdeck.app.store.inspect import InvalidModelError, read_config
from kvdeck.app.store.local_models import LocalModel
from kvdeck.app.store.recommended import RECOMMENDED, local_memory_estimate
from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.engine_session import EngineSession
from kvdeck.tui.key_routing import stray_text
from kvdeck.tui.messages import SwitchModelRequested
from kvdeck.tui.widgets.model_tables import PENDING_PREFIX, LocalModelsTable, RecommendedTable
from kvdeck.tui.widgets.model_task_panel import ModelTaskPanel


def nvidia_smi_free_bytes() -> int | None:
    """Free memory of GPU 0 without creating a CUDA context in the UI process."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout  # fmt: skip
        return int(out.splitlines()[0].strip()) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class ConfirmDeleteScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Delete", id="confirm_delete_yes"),
        Binding("n,escape", "answer(False)", "Keep", id="confirm_delete_no"),
    ]
    DEFAULT_CSS = """
    ConfirmDeleteScreen { align: center middle; }
    ConfirmDeleteScreen > Vertical {
        width: 64; max-width: 100%; height: auto; border: thick $error; background: $surface;
        padding: 0 1;
    }
    ConfirmDeleteScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmDeleteScreen Button { margin-left: 1; }
    """

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"Delete {self.what}?\nThe files are removed from disk.")
            with Horizontal():
                yield Button("Keep (n)", id="keep")
                yield Button("Delete (y)", id="delete", variant="error")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "delete")


class ModelsScreen(Screen):
    BINDINGS = [
        Binding("ctrl+k", "cancel_task", "Cancel task", id="models_cancel",
                tooltip="Cancel the running download, quantisation or comparison"),
        Binding("ctrl+r", "refresh", "Refresh", id="models_refresh",
                tooltip="List the local models again"),
    ]
    HELP_GROUPS = [("The local models table (focused)", LocalModelsTable.BINDINGS),
                   ("The recommended table (focused)", RecommendedTable.BINDINGS)]
    DEFAULT_CSS = """
    ModelsScreen { layout: vertical; }
    ModelsScreen #models-title { height: 1; padding: 0 1; background: $boost; }
    ModelsScreen .section { height: 1; padding: 0 1; text-style: bold; margin-top: 1; }
    ModelsScreen LocalModelsTable { height: 1fr; min-height: 4; }
    ModelsScreen RecommendedTable { height: 1fr; min-height: 4; }
    ModelsScreen #pull-row { height: 3; }
    ModelsScreen #repo-input { width: 1fr; }
    """

    def __init__(
        self,
        engine: EngineSession | None = None,
        activity: ActivityTracker | None = None,
        free_gpu_bytes: Callable[[], int | None] | None = nvidia_smi_free_bytes,
        quantize_options: QuantizeOptions | None = None,
        context_tokens: int = 8192,
        compare_options: dict | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine or EngineSession()  # which model is loaded (None: not in an app)
        self.activity = activity or ActivityTracker()
        self.free_gpu_bytes = free_gpu_bytes
        self.quantize_options = quantize_options
        self.context_tokens = context_tokens
        self.compare_options = compare_options or {}  # start_compare's seq_len, max_windows...
        self.download_cancel: CancelToken | None = None
        self.quantize_job: QuantizeJob | None = None
        self.compare_job: CompareJob | None = None
        self.models: list[LocalModel] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="models-title")
        yield Label("Local models", classes="section")
        yield LocalModelsTable(id="local-models")
        yield Label("Recommended for one GPU (p downloads the selected row)", classes="section")
        yield RecommendedTable(id="recommended")
        with Horizontal(id="pull-row"):
            yield Input(placeholder="any hub repo id, e.g. Qwen/Qwen2.5-0.5B-Instruct",
                        id="repo-input", select_on_focus=False)  # fmt: skip
            yield Button("Download", id="pull-button", variant="primary")
        yield ModelTaskPanel(id="task-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.action_refresh()

    def on_key(self, event: events.Key) -> None:
        """A printable key that no focused table claims is typed into the input: typing a
        path or a repo id never runs a shortcut."""
        text = stray_text(self, event)
        if text is None:
            return
        event.stop()
        event.prevent_default()
        repo_input = self.query_one("#repo-input", Input)
        repo_input.focus()
        repo_input.insert_text_at_cursor(text)

    @property
    def busy(self) -> bool:
        return (self.download_cancel is not None or self.quantize_job is not None
                or self.compare_job is not None)  # fmt: skip

    def _from_thread(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback` on the UI thread; dropped if the app has already closed."""
        try:
            self.app.call_from_thread(callback, *args)
        except RuntimeError:
            pass

    # -- listing ---------------------------------------------------------------------------

    def action_refresh(self) -> None:
        try:
            self.models = local_models.list_models()
            pending = local_models.pending_downloads()
        except ValueError as exc:  # an unreadable registry
            self.notify(str(exc), severity="error", timeout=10)
            self.models, pending = [], []
        free_gpu = self.free_gpu_bytes() if self.free_gpu_bytes else None
        self.query_one(LocalModelsTable).show(self.models, pending, free_gpu, self.context_tokens)
        self.query_one(RecommendedTable).show(RECOMMENDED, free_gpu, self.context_tokens)
        gpu = f"GPU free {format_bytes(free_gpu)}" if free_gpu is not None else "no GPU seen"
        self.query_one("#models-title", Static).update(
            f"Models · disk free {format_bytes(local_models.free_disk_bytes())}"
            f" · {gpu} · cache {paths.hf_hub_cache()}"
        )

    def selected_local(self) -> LocalModel | None:
        key = self.query_one(LocalModelsTable).selected_key()
        return next((m for m in self.models if m.name == key), None)

    # -- download --------------------------------------------------------------------------

    @on(Input.Submitted, "#repo-input")
    @on(Button.Pressed, "#pull-button")
    def _pull_from_input(self) -> None:
        self.action_pull()

    def action_pull(self) -> None:
        repo_id = self.query_one("#repo-input", Input).value.strip()
        if not repo_id:
            focused = self.focused
            if isinstance(focused, LocalModelsTable):
                key = focused.selected_key() or ""
                repo_id = key[len(PENDING_PREFIX):] if key.startswith(PENDING_PREFIX) else ""
            else:
                repo_id = self.query_one(RecommendedTable).selected_key() or ""
        if not repo_id:
            self.notify("Type a hub repo id or select a recommended model", severity="warning")
            return
        self.start_download(repo_id)

    def start_download(self, repo_id: str) -> None:
        if self.busy:
            self.notify("A task is already running (ctrl+k cancels it)", severity="warning")
            return
        self.download_cancel = CancelToken()
        self.query_one(ModelTaskPanel).start(f"Downloading {repo_id}")
        cancel = self.download_cancel
        self.run_worker(lambda: self._download_thread(repo_id, cancel), thread=True,
                        group="model-download", exit_on_error=False)  # fmt: skip

    def _download_thread(self, repo_id: str, cancel: CancelToken) -> None:
        def report(p: DownloadProgress) -> None:
            self._from_thread(self._show_download, p)

        try:
            model = download_model(repo_id, on_progress=report, cancel=cancel)
            outcome = (f"{model.name} verified and added ({format_bytes(model.size_bytes)})", False)
        except DownloadCancelled:
            outcome = (f"Download of {repo_id} cancelled; enter on its row resumes it", False)
        except (DownloadError, ValueError) as exc:
            outcome = (str(exc), True)
        except Exception as exc:  # noqa: BLE001 - show the unexpected too, never crash the UI
            outcome = (f"{type(exc).__name__}: {exc}", True)
        self._from_thread(self._task_finished, *outcome)

    def _show_download(self, p: DownloadProgress) -> None:
        self.query_one(ModelTaskPanel).show_download(p)

    # -- quantise --------------------------------------------------------------------------

    def action_quantize(self) -> None:
        model = self.selected_local()
        if model is None:
            self.notify("Select a local model to quantise", severity="warning")
            return
        if self.busy:
            self.notify("A task is already running (ctrl+k cancels it)", severity="warning")
            return
        try:
            job = start_quantize(model, options=self.quantize_options,
                                 on_progress=self._quantize_progress_from_thread)  # fmt: skip
        except ValueError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.quantize_job = job
        self.query_one(ModelTaskPanel).start(f"Quantising {model.name} to AWQ INT4 → {job.name}")

    def _quantize_progress_from_thread(self, p: QuantizeProgress) -> None:
        self._from_thread(self._quantize_progress, p)

    def _quantize_progress(self, p: QuantizeProgress) -> None:
        job = self.quantize_job
        if job is None:
            return
        if p.phase in ("done", "failed", "cancelled"):
            self.quantize_job = None
            if p.phase == "done" and job.result is not None:
                src, out = job.source, job.result
                ratio = src.size_bytes / out.size_bytes if out.size_bytes else 0.0
                self._task_finished(
                    f"{out.name} added: {format_bytes(out.size_bytes)} vs"
                    f" {format_bytes(src.size_bytes)} for {src.name} ({ratio:.1f}x smaller)", False
                )
            elif p.phase == "cancelled":
                self._task_finished("Quantisation cancelled; nothing was kept", False)
            else:
                self._task_finished(f"Quantisation failed: {p.message}", True)
            return
        self.query_one(ModelTaskPanel).show_quantize(p)

    # -- compare ---------------------------------------------------------------------------

    def action_compare(self) -> None:
        model = self.selected_local()
        origin = next((m for m in self.models if model and m.name == model.origin), None)
        if model is None or origin is None:
            self.notify("Select a model quantised here (its original must still be listed)",
                        severity="warning")  # fmt: skip
            return
        if self.busy:
            self.notify("A task is already running (ctrl+k cancels it)", severity="warning")
            return
        try:
            self.compare_job = start_compare(
                origin, model, on_message=lambda m: self._from_thread(self._compare_message, m),
                on_end=lambda job: self._from_thread(self._compare_finished, job),
                **self.compare_options,
            )  # fmt: skip
        except ValueError as exc:
            self.notify(str(exc), severity="error")
            return
        self.query_one(ModelTaskPanel).start(f"Perplexity: {model.name} vs {origin.name}")

    def _compare_message(self, message: str) -> None:
        if self.compare_job is not None:
            self.query_one(ModelTaskPanel).show_message(message)

    def _compare_finished(self, job: CompareJob) -> None:
        self.compare_job = None
        background = job.background
        if background is not None and background.cancelled:
            self._task_finished("Comparison cancelled", False)
        elif background is not None and background.error is not None:
            self._task_finished(f"Comparison failed: {background.error}", True)
        elif job.result is not None:
            self._task_finished(job.result.summary(), False)

    # -- cancel, finish --------------------------------------------------------------------

    @on(Button.Pressed, "#task-cancel")
    def action_cancel_task(self) -> None:
        if self.download_cancel is not None:
            self.download_cancel.cancel()
        elif self.quantize_job is not None or self.compare_job is not None:
            job = self.quantize_job or self.compare_job
            self.run_worker(job.cancel, thread=True, group="model-cancel", exit_on_error=False)
        else:
            self.notify("No task is running")

    def _task_finished(self, message: str, error: bool) -> None:
        self.download_cancel = None
        self.query_one(ModelTaskPanel).finish(message, error)
        if error:
            self.notify(message, severity="error", timeout=10)
        self.action_refresh()

    # -- load, delete ----------------------------------------------------------------------

    def action_load(self) -> None:
        key = self.query_one(LocalModelsTable).selected_key() or ""
        if key.startswith(PENDING_PREFIX):  # an incomplete download: go on with it
            self.start_download(key[len(PENDING_PREFIX):])
            return
        model = self.selected_local()
        if model is None:
            self.notify("Select a local model to load", severity="warning")
            return
        if not model.supported:
            self.notify(f"kvdeck cannot run {model.architecture}", severity="error")
            return
        try:
            est = local_memory_estimate(read_config(Path(model.path)), model.size_bytes,
                                        self.context_tokens)  # fmt: skip
        except InvalidModelError as exc:
            self.notify(str(exc), severity="error")
            return
        free = self.free_gpu_bytes() if self.free_gpu_bytes else None
        needs = f"needs about {format_bytes(est.total_bytes)}"
        if free is not None and est.total_bytes > free:
            self.notify(f"{model.name} {needs}, only {format_bytes(free)} free on the GPU",
                        severity="warning", timeout=8)  # fmt: skip
        self.post_message(SwitchModelRequested(str(model.path), model.name))
        self.notify(f"Loading {model.name} ({needs})")

    def action_delete(self) -> None:
        model = self.selected_local()
        key = self.query_one(LocalModelsTable).selected_key() or ""
        if model is None and not key.startswith(PENDING_PREFIX):
            self.notify("Select a local model to delete", severity="warning")
            return
        if self.busy:
            self.notify("Wait for the running task (or cancel it) first", severity="warning")
            return
        name = model.name if model else key[len(PENDING_PREFIX):]
        what = f"{name} ({format_bytes(model.size_bytes)})" if model else f"incomplete {name}"

        def confirmed(answer: bool | None) -> None:
            if not answer:
                return
            try:
                local_models.delete_model(name)
            except (KeyError, OSError) as exc:
                self.notify(f"Could not delete {name}: {exc}", severity="error")
            else:
                self.notify(f"Deleted {name}")
            self.action_refresh()

        self.app.push_screen(ConfirmDeleteScreen(what), confirmed)
