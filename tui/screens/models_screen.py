"""The Models screen: local models (the bundled one, added folders, downloads, quantised
ones), recommended ones; download, add a folder, quantise, compare, load, delete.

Self-contained: the app passes the services it owns (the engine session, the activity
tracker, where free memory is read) to the constructor; loading a model is a message
(SwitchModelRequested) the app acts on. The running task lives in a ModelTaskRunner.
Everything works offline: only "Download" needs the hub.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Static

from kvdeck.app.jobs.compare import check_eval_text, heldout_text_for
from kvdeck.app.jobs.quantize import QuantizeOptions
from kvdeck.app.jobs.quantize_estimate import quantize_choices, start_probe
from kvdeck.app.store import local_models, paths
from kvdeck.app.store.adapter_folders import add_adapter_folder, find_adapters
from kvdeck.app.store.cpu_plan import CpuFeatures
from kvdeck.app.store.download_progress import format_bytes
from kvdeck.app.store.inspect import InvalidModelError
from kvdeck.app.store.local_models import BUNDLED_NAME, LocalModel
from kvdeck.app.store.recommended import RECOMMENDED
from kvdeck.engine.types.lora import ADAPTER_CONFIG
from kvdeck.kernels.w4a16_choice import is_w4a16, w4a16_serving_kernel
from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.engine_session import EngineSession
from kvdeck.tui.host_memory import available_ram_bytes, nvidia_smi_free_bytes
from kvdeck.tui.key_routing import stray_text
from kvdeck.tui.messages import SwitchModelRequested
from kvdeck.tui.model_task_runner import ModelTaskRunner
from kvdeck.tui.screens.confirm_delete import ConfirmDeleteScreen
from kvdeck.tui.screens.path_prompt import PathPromptScreen
from kvdeck.tui.screens.quantize_dialog import ProbeFactory, QuantizeChoice, QuantizeDialog
from kvdeck.tui.widgets.flow_text import FlowText
from kvdeck.tui.widgets.model_tables import (
    PENDING_PREFIX,
    AdaptersTable,
    LocalModelsTable,
    MemoryBudget,
    RecommendedTable,
    local_estimate,
)
from kvdeck.tui.widgets.model_task_panel import ModelTaskPanel

__all__ = ["ConfirmDeleteScreen", "ModelsScreen"]

def _looks_like_a_path(text: str) -> bool:
    return text.startswith(("/", "~", ".")) or Path(text).expanduser().is_dir()


def _folder_problem(path: str) -> str | None:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return f"{path}: no such folder"
    if not (folder / "config.json").is_file() and not (folder / ADAPTER_CONFIG).is_file():
        return (f"{path} has no config.json (a Hugging Face model) or {ADAPTER_CONFIG} "
                "(a LoRA adapter)")
    return None


class ModelsScreen(Screen):
    BINDINGS = [
        Binding("ctrl+o", "add_folder", "Add folder…", id="models_add_folder",
                tooltip="List a model folder from elsewhere on disk (nothing is copied)"),
        Binding("ctrl+k", "cancel_task", "Cancel task", id="models_cancel",
                tooltip="Cancel the running download, quantisation or comparison"),
        Binding("ctrl+r", "refresh", "Refresh", id="models_refresh",
                tooltip="List the local models again"),
    ]
    HELP_GROUPS = [("The local models table (focused)", LocalModelsTable.BINDINGS),
                   ("The recommended table (focused)", RecommendedTable.BINDINGS)]
    DEFAULT_CSS = """
    ModelsScreen { layout: vertical; }
    ModelsScreen #models-title { padding: 0 1; background: $boost; }
    ModelsScreen .section { height: 1; padding: 0 1; text-style: bold; margin-top: 1; }
    ModelsScreen #fits-note { height: auto; padding: 0 1; color: $text-muted; }
    ModelsScreen LocalModelsTable { height: 1fr; min-height: 4; }
    ModelsScreen RecommendedTable { height: 1fr; min-height: 4; }
    ModelsScreen AdaptersTable { height: auto; max-height: 6; }
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
        free_ram_bytes: Callable[[], int | None] | None = available_ram_bytes,
        cpu: CpuFeatures | None = None,
        quantize_probe: ProbeFactory | None = start_probe,
    ) -> None:
        super().__init__()
        self.engine = engine or EngineSession()  # which model is loaded (None: not in an app)
        self.activity = activity or ActivityTracker()
        self.free_gpu_bytes = free_gpu_bytes
        self.free_ram_bytes = free_ram_bytes
        self.cpu = cpu  # what the CPU engine can do (None: this machine's, from /proc/cpuinfo)
        self.quantize_options = quantize_options
        self.quantize_probe = quantize_probe  # times a quantisation before it starts (None: no probe)
        self.context_tokens = context_tokens
        self.compare_options = compare_options or {}  # start_compare's seq_len, max_windows...
        self.models: list[LocalModel] = []
        self.tasks: ModelTaskRunner | None = None  # made once the panel exists

    def compose(self) -> ComposeResult:
        yield FlowText(sep=" · ", id="models-title")  # breaks between its figures
        yield Label("Local models (l load · a quantise · e compare · x delete)", classes="section")
        yield LocalModelsTable(id="local-models")
        yield Static("", id="w4a16-note")
        yield Label("LoRA adapters (serve with --enable-lora; the chat settings pick one)",
                    classes="section", id="adapters-title")
        yield AdaptersTable(id="adapters")
        yield Label("Recommended (p downloads the selected row)", classes="section")
        yield Static("", id="fits-note")
        yield RecommendedTable(id="recommended")
        with Horizontal(id="pull-row"):
            yield Input(placeholder="a hub repo id (org/name) to download, or a model folder "
                                    "on disk to add", id="repo-input", select_on_focus=False)
            yield Button("Download / add", id="pull-button", variant="primary")
            yield Button("Add folder…", id="add-folder-button")
        yield ModelTaskPanel(id="task-panel")
        yield Footer()

    def on_mount(self) -> None:
        self.tasks = ModelTaskRunner(self.query_one(ModelTaskPanel), self.activity,
                                     self._to_ui, self._task_finished)
        self._serving = self.engine.serving_dirs()
        self.action_refresh()
        self.set_interval(1.0, self._follow_engine)

    def on_screen_resume(self) -> None:
        self.action_refresh()  # a model may have been pulled, quantised or loaded meanwhile

    def _follow_engine(self) -> None:
        """Mark the model the engine loaded once it has (a switch takes seconds)."""
        serving = self.engine.serving_dirs()
        if serving != self._serving:
            self._serving = serving
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
        return self.tasks is not None and self.tasks.busy

    def _to_ui(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback` on the UI thread; dropped if the app has already closed (asked first:
        a closed loop refuses the call after its coroutine is made, which then warns)."""
        app = self.app
        if not app.is_running:
            return
        try:
            app.call_from_thread(callback, *args)
        except RuntimeError:  # it closed just now
            pass

    def _runner(self) -> ModelTaskRunner | None:
        """The task runner if it is free; else says why not (None)."""
        if self.tasks is not None and self.tasks.busy:
            self.notify("A task is already running (ctrl+k cancels it)", severity="warning")
            return None
        return self.tasks

    # -- listing ---------------------------------------------------------------------------

    def memory_budget(self) -> MemoryBudget:
        gpu = self.free_gpu_bytes() if self.free_gpu_bytes else None
        if gpu is not None:
            return MemoryBudget("cuda", gpu)
        return MemoryBudget("cpu", self.free_ram_bytes() if self.free_ram_bytes else None, self.cpu)

    def action_refresh(self) -> None:
        try:
            self.models = local_models.list_models(bundled=True)
            pending = local_models.pending_downloads()
        except ValueError as exc:  # an unreadable registry
            self.notify(str(exc), severity="error", timeout=10)
            self.models, pending = [], []
        budget = self.memory_budget()
        loaded = {m.name for m in self.models if self.engine.serves(m.path)}
        self.query_one(LocalModelsTable).show(self.models, pending, budget, self.context_tokens,
                                              loaded)
        self.query_one(RecommendedTable).show(RECOMMENDED, budget, self.context_tokens)
        adapters = find_adapters(self.models)
        self.query_one(AdaptersTable).show(adapters)
        for widget in (self.query_one(AdaptersTable), self.query_one("#adapters-title")):
            widget.display = bool(adapters)  # no empty section for those who use none
        self.query_one("#fits-note", Static).update(budget.explain(self.context_tokens))
        self._show_w4a16_kernel(budget)
        self.query_one("#models-title", FlowText).set_rows([[Text(part) for part in (
            "Models", f"disk free {format_bytes(local_models.free_disk_bytes())}",
            *budget.headline(), f"cache {paths.hf_hub_cache()}")]])

    def _show_w4a16_kernel(self, budget: MemoryBudget) -> None:
        """Under the local models, where one is AWQ/GPTQ INT4: the kernel that serves it here."""
        note = self.query_one("#w4a16-note", Static)
        note.display = any(is_w4a16(m.quantization) for m in self.models)
        if not note.display:
            return
        try:
            kernel = w4a16_serving_kernel(on_cuda=budget.device == "cuda",
                                          cpu_int4=budget.cpu_features.int4_kernels)
        except ValueError as exc:  # a bad KVDECK_W4A16_KERNEL: say it, the engine would refuse
            kernel = str(exc)
        note.update(f"W4A16 (AWQ/GPTQ INT4) models run on: {kernel}")

    def selected_local(self) -> LocalModel | None:
        key = self.query_one(LocalModelsTable).selected_key()
        return next((m for m in self.models if m.name == key), None)

    def _select(self, name: str) -> None:
        table = self.query_one(LocalModelsTable)
        table.focus()
        table.select_key(name)

    # -- download, add a folder ------------------------------------------------------------

    @on(Input.Submitted, "#repo-input")
    @on(Button.Pressed, "#pull-button")
    def _pull_from_input(self) -> None:
        self.action_pull()

    def action_pull(self) -> None:
        text = self.query_one("#repo-input", Input).value.strip()
        if text and _looks_like_a_path(text):  # offline use: a folder on disk, not the hub
            self.add_folder(text)
            return
        repo_id = text
        if not repo_id:
            focused = self.focused
            if isinstance(focused, LocalModelsTable):
                key = focused.selected_key() or ""
                repo_id = key[len(PENDING_PREFIX):] if key.startswith(PENDING_PREFIX) else ""
            else:
                repo_id = self.query_one(RecommendedTable).selected_key() or ""
        if not repo_id:
            self.notify("Type a hub repo id or a model folder, or select a recommended model",
                        severity="warning")  # fmt: skip
            return
        self.start_download(repo_id)

    def start_download(self, repo_id: str) -> None:
        runner = self._runner()
        if runner is not None:
            runner.download(repo_id)

    @on(Button.Pressed, "#add-folder-button")
    def action_add_folder(self) -> None:
        typed = self.query_one("#repo-input", Input).value.strip()

        def chosen(path: str | None) -> None:
            if path is not None:
                self.add_folder(path)

        self.app.push_screen(PathPromptScreen(
            "Add a model folder",
            "A folder with config.json and safetensors weights (a Hugging Face model), or a "
            "PEFT LoRA adapter's folder. It is listed, not copied; deleting it here only takes "
            "it off the list.",
            _folder_problem, value=typed if _looks_like_a_path(typed) else "",
            placeholder="/path/to/model", action="Add"), chosen)

    def add_folder(self, path: str) -> None:
        if (Path(path).expanduser() / ADAPTER_CONFIG).is_file():
            self.add_adapter(path)
            return
        try:
            model = local_models.add_folder(path)
        except ValueError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.query_one("#repo-input", Input).value = ""
        self.notify(f"Added {model.name} ({format_bytes(model.size_bytes)}) from {model.path}")
        self.action_refresh()
        self._select(model.name)

    def add_adapter(self, path: str) -> None:
        try:
            adapter = add_adapter_folder(path, self.models)
        except ValueError as exc:
            self.notify(f"Not added: {exc}", severity="error", timeout=8)
            return
        self.query_one("#repo-input", Input).value = ""
        base = adapter.base_model or adapter.base or "an unknown model"
        self.notify(f"Added LoRA adapter {adapter.name} (rank {adapter.rank}, for {base})")
        self.action_refresh()

    # -- quantise, compare -----------------------------------------------------------------

    def action_quantize(self) -> None:
        """Ask AWQ or RTN and the group size (QuantizeDialog: each method's time here, from a
        timed probe, and its quality), then start the job; a cancelled dialog starts nothing."""
        model = self.selected_local()
        if model is None:
            self.notify("Select a local model to quantise", severity="warning")
            return
        if self._runner() is None:
            return
        try:
            choices = quantize_choices(model)
        except ValueError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        probe = None
        if self.quantize_probe is not None:  # timed at the default group size
            probe = partial(self.quantize_probe, model, self.quantize_options,
                            group_size=choices.group_sizes[0])

        def chosen(choice: QuantizeChoice | None) -> None:
            if choice is not None:
                self._start_quantize(model, choice)

        self.app.push_screen(QuantizeDialog(model.name, choices.group_sizes, probe,
                                            group_note=choices.note), chosen)

    def _start_quantize(self, model: LocalModel, choice: QuantizeChoice) -> None:
        runner = self._runner()
        if runner is None:
            return
        options = replace(self.quantize_options or QuantizeOptions(), method=choice.method,
                          group_size=choice.group_size)
        try:
            runner.quantize(model, options)
        except ValueError as exc:
            self.notify(str(exc), severity="error", timeout=8)

    def action_compare(self) -> None:
        model = self.selected_local()
        origin = self._origin_of(model) if model is not None else None
        if model is None or origin is None:
            self.notify("Select a model quantised here (its original must still be there)",
                        severity="warning")  # fmt: skip
            return
        if self._runner() is None:
            return
        heldout = heldout_text_for(origin, model)
        if heldout is not None:
            self._start_compare(origin, model, str(heldout))
            return

        def chosen(path: str | None) -> None:
            if path is not None:
                self._start_compare(origin, model, str(Path(path).expanduser()))

        self.app.push_screen(PathPromptScreen(
            f"Compare {model.name} with {origin.name}",
            f"{origin.name} ships no heldout.txt. Perplexity needs text neither model was "
            "tuned on: not the calibration text AWQ fitted its scales to.",
            lambda p: check_eval_text(p, model.calibration_file),
            placeholder="/path/to/text.txt", action="Compare"), chosen)

    def _origin_of(self, model: LocalModel) -> LocalModel | None:
        origin = next((m for m in self.models if m.name == model.origin), None)
        if origin is None and model.origin_path:  # quantised from a folder kvdeck does not list
            origin = local_models.describe_folder(model.origin_path)
        return origin

    def _start_compare(self, origin: LocalModel, model: LocalModel, text_file: str) -> None:
        runner = self._runner()
        if runner is None:
            return
        try:
            runner.compare(origin, model, text_file, self.compare_options)
        except ValueError as exc:
            self.notify(str(exc), severity="error", timeout=8)

    # -- cancel, finish --------------------------------------------------------------------

    @on(Button.Pressed, "#task-cancel")
    def action_cancel_task(self) -> None:
        if self.tasks is None or not self.tasks.cancel():
            self.notify("No task is running")

    def _task_finished(self, message: str, error: bool) -> None:
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
        budget = self.memory_budget()
        try:
            est = local_estimate(model, budget, self.context_tokens)
        except InvalidModelError as exc:
            self.notify(str(exc), severity="error")
            return
        # The table's Needs figure, then with the runtime (what Fits compares).
        needs = (f"needs about {format_bytes(est.model_bytes)}, {format_bytes(est.total_bytes)} with the "
                 "runtime")
        if budget.free_bytes is not None and est.total_bytes > budget.free_bytes:
            self.notify(f"{model.name} {needs}, only {format_bytes(budget.free_bytes)} free",
                        severity="warning", timeout=8)  # fmt: skip
        bundled = model.source == "bundled"  # the engine's own default: no --model
        self.post_message(SwitchModelRequested(None if bundled else str(model.path), model.name))
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
        if model is not None and model.source == "bundled":
            self.notify(f"{model.name} is part of kvdeck and cannot be deleted",
                        severity="warning")
            return
        name = model.name if model else key[len(PENDING_PREFIX):]
        if model is not None and not model.deletable:  # an added folder: only unlisted
            question = f"Take {name} off the list?"
            detail, action = f"{model.path} is left on disk as it is.", "Remove"
        else:
            size = f" ({format_bytes(model.size_bytes)})" if model else ""
            question = f"Delete {name}{size}?" if model else f"Delete incomplete {name}?"
            detail, action = "The files are removed from disk.", "Delete"
        loaded = model is not None and model.deletable and self.engine.serves(model.path)
        if loaded:
            detail = (f"{name} is loaded in the engine: the engine switches to {BUNDLED_NAME} "
                      f"first. {detail}")

        def confirmed(answer: bool | None) -> None:
            if not answer:
                return
            if loaded and model is not None:
                self.post_message(SwitchModelRequested(None, BUNDLED_NAME))
                self.run_worker(self._delete_once_released(name, model.path),
                                group="models-delete")
            else:
                self._delete(name)

        self.app.push_screen(ConfirmDeleteScreen(question, detail, action), confirmed)

    async def _delete_once_released(self, name: str, path: Path) -> None:
        if not await self.engine.wait_released(path):
            self.notify(f"The engine still holds {name}; not deleted", severity="error")
            return
        self._delete(name)

    def _delete(self, name: str) -> None:
        try:
            removed = local_models.delete_model(name)
        except (KeyError, OSError, ValueError) as exc:
            self.notify(f"Could not delete {name}: {exc}", severity="error")
        else:
            gone = "taken off the list" if removed.exists() else "deleted"
            self.notify(f"{name} {gone}")
        self.action_refresh()
