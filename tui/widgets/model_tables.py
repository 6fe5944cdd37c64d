"""Tables of the models screen: local models (with incomplete downloads) and recommended ones.

Rows are keyed by the model's name / repo id, so the screen acts on `selected_key()`.
"Needs" is what the model itself takes (weights and the KV cache of one full sequence);
"Fits" compares that plus the runtime with the free memory where it would run: the GPU,
or on a machine without one, the RAM, counted as the CPU engine will hold the model on this
CPU (its dtype there, INT4 layers at 4 bits, an INT4 model's head int8: app/store/cpu_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from kvdeck.app.store.adapter_folders import AdapterFolder
from kvdeck.app.store.cpu_plan import SHORT_DTYPES, CpuFeatures, cpu_features
from kvdeck.app.store.download_progress import format_bytes
from kvdeck.app.store.inspect import InvalidModelError, read_config
from kvdeck.app.store.local_models import LocalModel, PendingDownload
from kvdeck.app.store.recommended import (
    CPU_RUNTIME_OVERHEAD_BYTES,
    RUNTIME_OVERHEAD_BYTES,
    GiB,
    MemoryEstimate,
    RecommendedModel,
    format_params,
    local_memory_estimate,
    memory_estimate,
    num_parameters,
)
from kvdeck.engine.types.config import DTYPE_ALIASES

PENDING_PREFIX = "pending:"


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    device: str  # "cuda": free GPU memory; "cpu": no GPU seen, free RAM
    free_bytes: int | None  # None: unknown
    cpu: CpuFeatures | None = None  # what the CPU engine can do here (None: this machine's)

    @property
    def cpu_features(self) -> CpuFeatures:
        return self.cpu or cpu_features()

    def fits(self, estimate: MemoryEstimate) -> Text:
        if self.free_bytes is None:
            return Text("?", style="dim")
        if estimate.total_bytes <= self.free_bytes:
            return Text("yes" if self.device == "cuda" else "yes (CPU)", style="green")
        return Text("no" if self.device == "cuda" else "no (CPU)", style="red")

    def headline(self) -> list[str]:
        """The memory figures of the screen's title, one part each."""
        free = format_bytes(self.free_bytes) if self.free_bytes is not None else "unknown"
        return [f"GPU free {free}"] if self.device == "cuda" else ["no GPU seen", f"RAM free {free}"]

    def explain(self, context_tokens: int) -> str:
        if self.device == "cuda":
            where = f"free GPU memory, with {RUNTIME_OVERHEAD_BYTES / GiB:g} GiB for CUDA"
        else:
            where = (f"free RAM, with {CPU_RUNTIME_OVERHEAD_BYTES / GiB:g} GiB for torch (no GPU "
                     f"seen: kvdeck runs on the CPU, {self.cpu_features.dtype_note()})")
        return (f"Needs: weights + KV of one {context_tokens}-token sequence (or the model's "
                f"context). Fits: in {where}. Dtype: what the engine computes in, the "
                "checkpoint's in brackets where it differs.")


class _KeyedTable(DataTable):
    def selected_key(self) -> str | None:
        if self.row_count == 0:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    def select_key(self, key: str | None) -> None:
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
        Binding("a", "screen.quantize", "Quantise…", id="models_quantize",
                tooltip="Choose AWQ or RTN and the group size, with the time each takes here"),
        Binding("e", "screen.compare", "Compare", id="models_compare"),
        Binding("x,delete", "screen.delete", "Delete", id="models_delete"),
    ]
    COLUMNS = ("Name", "Architecture", "Params", "Dtype", "Quant", "Size", "Needs", "kvdeck",
               "Source")  # fmt: skip

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*self.COLUMNS)

    def show(self, models: list[LocalModel], pending: list[PendingDownload],
             budget: MemoryBudget | None = None, context_tokens: int = 8192,
             loaded: set[str] | None = None) -> None:  # fmt: skip
        keep = self.selected_key()
        budget = budget or MemoryBudget("cuda", None)
        self.clear()
        for m in models:
            supported = Text("yes", style="green") if m.supported else Text("no", style="red")
            # Verified: hashes checked on download, or made here; a folder is the user's own.
            checked = m.verified or m.source == "folder"
            source = Text(m.source + ("" if checked else " (unverified)"))
            if loaded and m.name in loaded:
                source.append(" · loaded", style="bold")
            try:
                estimate = local_estimate(m, budget, context_tokens)
            except InvalidModelError:
                estimate = None
            self.add_row(m.name, m.architecture, format_params(m.num_params),
                         engine_dtype_label(m, budget, estimate), m.quant_label,
                         format_bytes(m.size_bytes), _needs(estimate, budget), supported, source,
                         key=m.name)  # fmt: skip
        for p in pending:
            self.add_row(Text(p.repo_id, style="dim"), "", "", "", "", format_bytes(p.bytes_on_disk),
                         "", "", Text("incomplete: enter resumes", style="yellow"),
                         key=PENDING_PREFIX + p.repo_id)  # fmt: skip
        self.select_key(keep)


def local_estimate(model: LocalModel, budget: MemoryBudget, context_tokens: int) -> MemoryEstimate:
    """What loading `model` takes where the budget is (the table's Needs, the load notice);
    InvalidModelError if its config is unreadable."""
    config = read_config(model.path)
    device = "cuda" if budget.device == "cuda" else "cpu"
    return local_memory_estimate(config, model.size_bytes, context_tokens, device,
                                 model_dir=model.path, cpu=budget.cpu_features)


def engine_dtype_label(model: LocalModel, budget: MemoryBudget, estimate: MemoryEstimate | None) -> str:
    """The Dtype column: the dtype the engine computes in where the budget is, the checkpoint's
    in brackets when it differs ("bf16 (fp16)": an AutoAWQ checkpoint on a CPU with bf16 and the
    INT4 kernels). On the CPU cpu_plan's rule (the estimate's dtype); on a GPU the checkpoint's,
    bf16 for a float32 one (engine/runner/device.py, on a GPU with bf16)."""
    stored = DTYPE_ALIASES.get(model.dtype.replace("torch.", ""), model.dtype)
    if budget.device == "cuda":
        runs = "bfloat16" if stored == "float32" else stored
    else:
        runs = estimate.dtype if estimate is not None and estimate.dtype else stored
    label = SHORT_DTYPES.get(runs, runs)
    return label if runs == stored else f"{label} ({SHORT_DTYPES.get(stored, stored)})"


def _needs(estimate: MemoryEstimate | None, budget: MemoryBudget) -> Text:
    """Weights + KV of one sequence; red when it (with the runtime) will not fit."""
    if estimate is None:
        return Text("?", style="dim")
    too_big = budget.free_bytes is not None and estimate.total_bytes > budget.free_bytes
    return Text(format_bytes(estimate.model_bytes), style="red" if too_big else "")


class RecommendedTable(_KeyedTable):
    BINDINGS = [
        Binding("p,enter", "screen.pull", "Download", id="recommended_pull"),
    ]
    COLUMNS = ("Repo", "Params", "Quant", "Weights", "Needs", "Fits", "")

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*self.COLUMNS)

    def show(self, models: tuple[RecommendedModel, ...], budget: MemoryBudget,
             context_tokens: int) -> None:  # fmt: skip
        keep = self.selected_key()
        self.clear()
        device = "cuda" if budget.device == "cuda" else "cpu"
        for r in models:
            est = memory_estimate(r, context_tokens, device, cpu=budget.cpu_features)
            self.add_row(r.repo_id, format_params(num_parameters(r.arch)), r.quantization or "-",
                         format_bytes(est.weight_bytes), format_bytes(est.model_bytes),
                         budget.fits(est), "gated" if r.gated else "", key=r.repo_id)  # fmt: skip
        self.select_key(keep)


class AdaptersTable(_KeyedTable):
    """LoRA adapter folders found beside the models (app/store/adapter_folders.py), keyed by
    path: the model each was trained on, its rank and layers, or why it cannot be served."""

    COLUMNS = ("Adapter", "Base model", "Rank", "Targets", "Folder")

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*self.COLUMNS)

    def show(self, adapters: list[AdapterFolder]) -> None:
        keep = self.selected_key()
        self.clear()
        for a in adapters:
            base = Text(a.base_model) if a.base_model else Text(a.base or "?", style="dim")
            if a.problem is not None:
                self.add_row(a.name, "", "", Text(a.problem, style="red"), str(a.path),
                             key=str(a.path))
                continue
            self.add_row(a.name, base, str(a.rank), ",".join(t.removesuffix("_proj")
                                                              for t in a.target_modules),
                         str(a.path), key=str(a.path))
        self.select_key(keep)
