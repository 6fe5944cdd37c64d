"""The Models screen's one running task: a download, a quantisation or a comparison.

It starts the task (a download in a thread, the others in their own processes through
kvdeck.app.jobs), brings every report onto the UI thread, shows it on the task panel,
cancels on request, and registers the task with the activity tracker, so quitting asks
first and stops it. The screen only decides what to start and what to do when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from kvdeck.app.jobs.compare import CompareJob, CompareProgress, start_compare
from kvdeck.app.jobs.quantize import (
    METHOD_NAMES,
    QuantizeJob,
    QuantizeOptions,
    QuantizeProgress,
    start_quantize,
)
from kvdeck.app.store.download import CancelToken, DownloadError, download_model
from kvdeck.app.store.download_progress import DownloadCancelled, DownloadProgress, format_bytes
from kvdeck.app.store.local_models import LocalModel
from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.widgets.model_task_panel import ModelTaskPanel

ACTIVITY = "models-task"
ToUI = Callable[..., None]  # run a callback with its arguments on the UI thread
Finished = Callable[[str, bool], None]  # (outcome message, is an error)


@dataclass(slots=True)
class ModelTaskRunner:
    panel: ModelTaskPanel
    activity: ActivityTracker
    to_ui: ToUI
    on_finished: Finished
    download_cancel: CancelToken | None = None
    quantize_job: QuantizeJob | None = None
    compare_job: CompareJob | None = None

    @property
    def busy(self) -> bool:
        return (self.download_cancel is not None or self.quantize_job is not None
                or self.compare_job is not None)  # fmt: skip

    def _begin(self, title: str, description: str) -> None:
        self.panel.start(title)
        self.activity.begin(ACTIVITY, description, self.cancel_and_wait)

    def _finish(self, message: str, error: bool, complete: bool = False) -> None:
        self.download_cancel = self.quantize_job = self.compare_job = None
        self.activity.end(ACTIVITY)
        self.panel.finish(message, error, complete)
        self.on_finished(message, error)

    # -- download ----------------------------------------------------------------------
    def download(self, repo_id: str) -> None:
        cancel = self.download_cancel = CancelToken()
        self._begin(f"Downloading {repo_id}", f"the download of {repo_id}")
        threading.Thread(target=self._download_thread, args=(repo_id, cancel), daemon=True,
                         name="kvdeck-download").start()

    def _download_thread(self, repo_id: str, cancel: CancelToken) -> None:
        def report(p: DownloadProgress) -> None:
            self.to_ui(self.panel.show_download, p)

        try:
            model = download_model(repo_id, on_progress=report, cancel=cancel)
            outcome = (f"{model.name} verified and added ({format_bytes(model.size_bytes)})",
                       False, True)
        except DownloadCancelled:
            outcome = (f"Download of {repo_id} cancelled; enter on its row resumes it", False,
                       False)
        except (DownloadError, ValueError) as exc:
            outcome = (str(exc), True, False)
        except Exception as exc:  # noqa: BLE001 - show the unexpected too, never crash the UI
            outcome = (f"{type(exc).__name__}: {exc}", True, False)
        self.to_ui(self._finish, *outcome)

    # -- quantise ----------------------------------------------------------------------
    def quantize(self, model: LocalModel, options: QuantizeOptions | None) -> None:
        """ValueError (nothing started) if the model cannot be quantised."""
        job = start_quantize(model, options=options,
                             on_progress=lambda p: self.to_ui(self._quantize_progress, p))
        self.quantize_job = job
        method = METHOD_NAMES[job.method]
        group = f", group {options.group_size}" if options is not None and options.group_size else ""
        self._begin(f"Quantising {model.name} to {method} INT4{group} → {job.name}",
                    f"the {method} quantisation of {model.name}")

    def _quantize_progress(self, p: QuantizeProgress) -> None:
        job = self.quantize_job
        if job is None:
            return
        if p.phase == "done" and job.result is not None:
            src, out = job.source, job.result
            ratio = src.size_bytes / out.size_bytes if out.size_bytes else 0.0
            self._finish(f"{out.name} added: {format_bytes(out.size_bytes)} vs"
                         f" {format_bytes(src.size_bytes)} for {src.name} ({ratio:.1f}x smaller)",
                         False, complete=True)  # fmt: skip
        elif p.phase == "cancelled":
            self._finish(f"{p.method_name} quantisation cancelled; nothing was kept", False)
        elif p.phase in ("done", "failed"):
            self._finish(f"{p.method_name} quantisation failed: {p.message}", True)
        else:
            self.panel.show_quantize(p)

    # -- compare -----------------------------------------------------------------------
    def compare(self, original: LocalModel, quantized: LocalModel, text_file: str,
                options: dict) -> None:
        """ValueError (nothing started) if the pair or the text cannot be compared."""
        self.compare_job = start_compare(
            original, quantized, text_file=text_file,
            on_progress=lambda p: self.to_ui(self._compare_progress, p),
            on_end=lambda job: self.to_ui(self._compare_finished, job), **options,
        )  # fmt: skip
        self._begin(f"Perplexity: {quantized.name} vs {original.name}",
                    f"the comparison of {quantized.name}")

    def _compare_progress(self, p: CompareProgress) -> None:
        if self.compare_job is not None:
            self.panel.show_compare(p)

    def _compare_finished(self, job: CompareJob) -> None:
        background = job.background
        if background is not None and background.cancelled:
            self._finish("Comparison cancelled", False)
        elif background is not None and background.error is not None:
            self._finish(f"Comparison failed: {background.error}", True)
        elif job.result is not None:
            self._finish(job.result.summary(), False, complete=True)

    # -- cancel ------------------------------------------------------------------------
    def cancel(self) -> bool:
        """Ask the running task to stop (it reports its end as usual); False if none runs."""
        if self.download_cancel is not None:
            self.download_cancel.cancel()
            return True
        job = self.quantize_job or self.compare_job
        if job is None:
            return False
        threading.Thread(target=job.cancel, daemon=True, name="kvdeck-cancel").start()
        return True

    def cancel_and_wait(self) -> None:
        """For quitting: stop it; the activity tracker waits for its end."""
        self.cancel()
