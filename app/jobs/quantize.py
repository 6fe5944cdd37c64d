"""INT4 quantisation (AWQ, or round-to-nearest) of a local model in a background process,
with progress and cancel.

The quantiser (`quant.awq_pipeline.run_quantize_job`) runs in a spawned process
(`kvdeck.app.jobs.background`, the worker in `workers.py`), so the UI stays responsive and
a cancel is immediate. It writes into a per-job staging directory inside kvdeck's store;
only a finished, verified result is renamed into the store and registered. A cancelled or
failed job's staging directory is removed, so it leaves nothing behind.
"""

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.app.jobs.background import BackgroundJob, start_background
from kvdeck.app.store import paths, registry
from kvdeck.app.store.inspect import describe_model
from kvdeck.app.store.local_models import LocalModel, find_model
from kvdeck.engine.types.config import DEVICES
from kvdeck.quant.progress_text import remaining_seconds
from kvdeck.quant.staging import pid_alive

_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
WORKER = "kvdeck.app.jobs.workers:quantize_worker"  # named: the worker loads torch, this does not
_OWNER_FILE = "owner.pid"  # the kvdeck process that runs the job
METHODS = ("awq", "rtn")  # quant.awq_pipeline.METHODS (that module imports torch)
METHOD_NAMES = {"awq": "AWQ", "rtn": "RTN"}


@dataclass(slots=True)
class QuantizeOptions:
    method: str = "awq"  # awq | rtn (round to nearest: seconds, no calibration, lower quality)
    calib_file: str | None = None  # default: the calibration text shipped in assets/
    num_samples: int = 64
    seq_len: int = 512
    group_size: int | None = None  # None: the largest of 128/64/32 that divides the model
    device: str = "auto"
    num_threads: int | None = None  # torch threads in the worker (None: torch's default)

    def validate(self) -> None:
        for name in ("num_samples", "seq_len", "group_size"):
            value = getattr(self, name)
            if value is None and name == "group_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.calib_file is not None and not Path(self.calib_file).is_file():
            raise ValueError(f"calib_file {self.calib_file!r} does not exist")


@dataclass(slots=True)
class QuantizeProgress:
    phase: str  # starting | quantizing | writing | done | failed | cancelled
    layer: int = 0  # decoder layers finished
    num_layers: int = 0
    elapsed_s: float = 0.0
    eta_s: float | None = None  # None: too early to tell
    message: str = ""  # the step under way, or what went wrong
    done: float | None = None  # fraction of the work, finer than whole layers
    method: str = "awq"  # what the job does (its progress names it)

    @property
    def method_name(self) -> str:
        return METHOD_NAMES.get(self.method, self.method.upper())

    @property
    def fraction(self) -> float:
        if self.phase == "done":
            return 1.0
        if self.done is not None:
            return self.done
        return self.layer / self.num_layers if self.num_layers else 0.0


@dataclass(slots=True)
class QuantizeJob:
    """A running (or finished) job; `wait()` for it, `cancel()` it."""

    source: LocalModel
    name: str
    staging: Path
    on_progress: Callable[[QuantizeProgress], None] | None
    calibration_file: str | None = None  # None: kvdeck's calibration text
    method: str = "awq"
    progress: QuantizeProgress = field(default_factory=lambda: QuantizeProgress("starting"))
    result: LocalModel | None = None
    background: BackgroundJob | None = None

    @property
    def done(self) -> bool:
        return self.background is not None and self.background.done

    @property
    def error(self) -> str | None:
        return self.background.error if self.background is not None else None

    def wait(self, timeout: float | None = None) -> LocalModel | None:
        """Block until the job ends; returns the registered model (None if cancelled).

        Raises RuntimeError with the worker's message if it failed, TimeoutError on timeout.
        """
        assert self.background is not None
        self.background.wait_or_raise(timeout, f"quantisation of {self.source.name}")
        return self.result

    def cancel(self) -> None:
        """Stop the worker at once; its staging directory is removed."""
        assert self.background is not None
        self.background.cancel()

    def _report(self, progress: QuantizeProgress) -> None:
        progress.method = self.method
        self.progress = progress
        if self.on_progress is not None:
            self.on_progress(progress)

    def _on_message(self, message: tuple) -> None:
        if message[0] == "step":  # inside a layer (or before the first): a few seconds apart
            _, fraction, what, elapsed = message
            last = self.progress
            self._report(QuantizeProgress(
                "quantizing", last.layer, last.num_layers, elapsed,
                remaining_seconds(fraction, elapsed), what, max(fraction, last.fraction)))
            return
        _, layer, num_layers, elapsed, eta = message
        self._report(QuantizeProgress("quantizing", layer, num_layers, elapsed, eta,
                                      f"layer {layer}/{num_layers} done"))
        if layer == num_layers:
            self._report(QuantizeProgress("writing", layer, num_layers, elapsed, 0.0,
                                          "writing the checkpoint"))

    def _on_success(self, written: object) -> None:
        self.result = install_quantized(Path(str(written)), self.name, self.source.name,
                                        str(self.source.path), self.calibration_file, self.method)

    def _on_end(self, job: BackgroundJob) -> None:
        n = self.progress.num_layers
        if job.cancelled:
            self._report(QuantizeProgress("cancelled", self.progress.layer, n))
        elif job.error is not None:
            self._report(QuantizeProgress("failed", self.progress.layer, n, message=job.error))
        else:
            self._report(QuantizeProgress("done", n, n, self.progress.elapsed_s, 0.0))


def install_quantized(written: Path, name: str, origin: str, origin_path: str,
                      calibration_file: str | None = None, method: str = "awq") -> LocalModel:
    """Move a finished checkpoint from staging into the store and register it, with the
    model it was made from and the text it was calibrated on (for honest comparisons).
    InvalidModelError if it is not complete."""
    target = paths.store_dir() / name
    described = describe_model(written)
    if target.exists():
        raise ValueError(f"{target} appeared while the job ran")
    os.rename(written, target)
    registry.mark_verified(
        registry.store_key(name),
        {"origin": origin, "origin_path": origin_path, "method": method, "path": str(target),
         "architecture": described.architecture, "calibration_file": calibration_file},
    )  # fmt: skip
    model = find_model(name)
    assert model is not None
    return model


def new_staging(name: str) -> Path:
    """A job's own folder in the store's staging area (owner pid inside, see below)."""
    if not _NAME.match(name):
        raise ValueError(f"name must be letters, digits, '.', '_' or '-', got {name!r}")
    if (paths.store_dir() / name).exists():
        raise ValueError(f"a model named {name!r} already exists in {paths.store_dir()}")
    remove_orphaned_staging()
    staging = paths.staging_dir() / f"{name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    (staging / _OWNER_FILE).write_text(str(os.getpid()))
    return staging


def remove_orphaned_staging() -> list[Path]:
    """Staging directories of jobs whose kvdeck process died (killed, crashed): removed."""
    removed = []
    staging = paths.staging_dir()
    for job_dir in staging.iterdir() if staging.is_dir() else ():
        try:
            owner = int((job_dir / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = None
            if time.time() - job_dir.stat().st_mtime < 60:
                continue  # just created; its owner file is about to be written
        if owner is None or not pid_alive(owner):
            shutil.rmtree(job_dir, ignore_errors=True)
            removed.append(job_dir)
    return removed


def check_quantizable(model: LocalModel) -> None:
    """ValueError unless `model` can be quantised here (before any choice is asked)."""
    if model.quantization is not None:
        raise ValueError(f"{model.name} is already quantised ({model.quantization})")
    if not model.supported:
        raise ValueError(f"{model.name}: architecture {model.architecture} is not supported")


def default_name(source: LocalModel, method: str = "awq") -> str:
    return f"{source.name.replace('/', '--')}-{method}"


def start_quantize(
    source: LocalModel | str,
    name: str | None = None,
    options: QuantizeOptions | None = None,
    on_progress: Callable[[QuantizeProgress], None] | None = None,
) -> QuantizeJob:
    """Start quantising `source` (a listed model, or its name) into the store as `name`."""
    options = options or QuantizeOptions()
    options.validate()
    model = source if isinstance(source, LocalModel) else find_model(source)
    if model is None:
        raise ValueError(f"no local model named {source!r} (see `kvdeck models`)")
    check_quantizable(model)
    name = name or default_name(model, options.method)
    staging = new_staging(name)
    job = QuantizeJob(source=model, name=name, staging=staging, on_progress=on_progress,
                      calibration_file=options.calib_file if options.method == "awq" else None,
                      method=options.method)
    spec = {"source": str(model.path), "out_dir": str(staging / name),
            **{f: getattr(options, f) for f in QuantizeOptions.__slots__}}  # fmt: skip
    job.background = start_background(WORKER, spec, staging, job._on_message, job._on_success,
                                      job._on_end)  # fmt: skip
    return job
