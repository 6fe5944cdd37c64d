"""AWQ quantisation of a local model in a background process, with progress and cancel.

The quantiser (`quant.awq_pipeline.run_quantize_job`) runs in a spawned process, so the UI
stays responsive and a cancel is immediate (the process is terminated, not asked). It
writes into a per-job staging directory inside kvdeck's store; only a finished, verified
result is renamed into the store and registered. A cancelled or failed job removes its
staging directory, so it leaves nothing behind.
"""

import multiprocessing as mp
import os
import queue
import re
import shutil
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app import paths, registry
from app.model_inspect import InvalidModelError, describe_model
from app.model_store import LocalModel, find_model

_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
_POLL_S = 0.1
_TERMINATE_GRACE_S = 5.0
QUANTIZER = "quant.awq_pipeline:run_quantize_job"


@dataclass(slots=True)
class QuantizeOptions:
    calib_file: str | None = None  # default: the calibration text shipped in assets/
    num_samples: int = 128
    seq_len: int = 512
    group_size: int = 128
    device: str = "auto"
    num_threads: int | None = None  # torch threads in the worker (None: torch's default)

    def validate(self) -> None:
        for name in ("num_samples", "seq_len", "group_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {self.device!r}")
        if self.calib_file is not None and not Path(self.calib_file).is_file():
            raise ValueError(f"calib_file {self.calib_file!r} does not exist")


@dataclass(slots=True)
class QuantizeProgress:
    phase: str  # starting | quantizing | writing | done | failed | cancelled
    layer: int = 0  # decoder layers finished
    num_layers: int = 0
    elapsed_s: float = 0.0
    eta_s: float | None = None
    message: str = ""

    @property
    def fraction(self) -> float:
        if self.phase == "done":
            return 1.0
        return self.layer / self.num_layers if self.num_layers else 0.0


@dataclass(slots=True)
class QuantizeJob:
    """A running (or finished) job; `wait()` for it, `cancel()` it."""

    source: LocalModel
    name: str
    staging: Path
    on_progress: Callable[[QuantizeProgress], None] | None
    progress: QuantizeProgress = field(default_factory=lambda: QuantizeProgress("starting"))
    result: LocalModel | None = None
    error: str | None = None
    _process: mp.process.BaseProcess | None = None
    _queue: object = None
    _monitor: threading.Thread | None = None
    _cancel_requested: threading.Event = field(default_factory=threading.Event)
    _finished: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> LocalModel | None:
        """Block until the job ends; returns the registered model (None if cancelled).

        Raises RuntimeError with the worker's message if the job failed, TimeoutError on timeout.
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(f"quantisation of {self.source.name} still running")
        if self.error is not None:
            raise RuntimeError(self.error)
        return self.result

    def cancel(self) -> None:
        """Stop the worker at once and remove everything it wrote."""
        self._cancel_requested.set()
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()
        self._finished.wait(_TERMINATE_GRACE_S * 2 + 5)


def default_name(source: LocalModel) -> str:
    return source.name.replace("/", "--") + "-awq"


def start_quantize(
    source: LocalModel | str,
    name: str | None = None,
    options: QuantizeOptions | None = None,
    on_progress: Callable[[QuantizeProgress], None] | None = None,
    quantizer: str = QUANTIZER,
) -> QuantizeJob:
    """Start quantising `source` (a listed model, or its name) into the store as `name`."""
    options = options or QuantizeOptions()
    options.validate()
    model = source if isinstance(source, LocalModel) else find_model(source)
    if model is None:
        raise ValueError(f"no local model named {source!r} (see `kvdeck models`)")
    if model.quantization is not None:
        raise ValueError(f"{model.name} is already quantised ({model.quantization})")
    if not model.supported:
        raise ValueError(f"{model.name}: architecture {model.architecture} is not supported")
    name = name or default_name(model)
    if not _NAME.match(name):
        raise ValueError(f"name must be letters, digits, '.', '_' or '-', got {name!r}")
    if (paths.store_dir() / name).exists():
        raise ValueError(f"a model named {name!r} already exists in {paths.store_dir()}")
    staging = paths.staging_dir() / f"{name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    job = QuantizeJob(source=model, name=name, staging=staging, on_progress=on_progress)
    spec = {
        "quantizer": quantizer,
        "source": str(model.path),
        "out_dir": str(staging / name),
        "options": {f: getattr(options, f) for f in QuantizeOptions.__slots__},
    }
    ctx = mp.get_context("spawn")  # never fork a process that has torch or Textual threads
    job._queue = ctx.Queue()
    job._process = ctx.Process(target=_worker_main, args=(job._queue, spec), daemon=True)
    job._process.start()
    job._monitor = threading.Thread(target=_monitor, args=(job,), daemon=True)
    job._monitor.start()
    return job


def _monitor(job: QuantizeJob) -> None:
    """Forward the worker's messages; on success move the result into the store."""
    process = job._process
    assert process is not None
    outcome: tuple | None = None
    while outcome is None:
        if job._cancel_requested.is_set():
            break
        try:
            message = job._queue.get(timeout=_POLL_S)
        except queue.Empty:
            if not process.is_alive():
                try:  # the last message may have landed just before the exit
                    message = job._queue.get(timeout=_POLL_S)
                except queue.Empty:
                    outcome = ("error", f"the quantise worker exited with code {process.exitcode}")
                    break
            else:
                continue
        if message[0] == "progress":
            _, layer, num_layers, elapsed, eta = message
            _report(job, QuantizeProgress("quantizing", layer, num_layers, elapsed, eta))
            if layer == num_layers:
                _report(job, QuantizeProgress("writing", layer, num_layers, elapsed, 0.0))
        else:
            outcome = message
    _stop(process)
    if job._cancel_requested.is_set():
        shutil.rmtree(job.staging, ignore_errors=True)
        _report(job, QuantizeProgress("cancelled", job.progress.layer, job.progress.num_layers))
    elif outcome[0] == "done":
        _finish(job, Path(outcome[1]))
    else:
        shutil.rmtree(job.staging, ignore_errors=True)
        job.error = outcome[1]
        _report(job, QuantizeProgress("failed", job.progress.layer, job.progress.num_layers,
                                      message=outcome[1]))  # fmt: skip
    job._finished.set()


def _finish(job: QuantizeJob, written: Path) -> None:
    target = paths.store_dir() / job.name
    try:
        described = describe_model(written)
        if target.exists():
            raise ValueError(f"{target} appeared while the job ran")
        os.rename(written, target)
        registry.mark_verified(
            registry.store_key(job.name),
            {"origin": job.source.name, "method": "awq", "path": str(target),
             "architecture": described.architecture},
        )  # fmt: skip
        job.result = find_model(job.name)
        _report(job, QuantizeProgress("done", job.progress.num_layers, job.progress.num_layers,
                                      job.progress.elapsed_s, 0.0))  # fmt: skip
    except (InvalidModelError, ValueError, OSError) as exc:
        job.error = f"the quantised model could not be stored: {exc}"
        _report(job, QuantizeProgress("failed", message=job.error))
    finally:
        shutil.rmtree(job.staging, ignore_errors=True)


def _report(job: QuantizeJob, progress: QuantizeProgress) -> None:
    job.progress = progress
    if job.on_progress is not None:
        job.on_progress(progress)


def _stop(process: mp.process.BaseProcess) -> None:
    if process.is_alive():
        process.terminate()
        process.join(_TERMINATE_GRACE_S)
    if process.is_alive():
        process.kill()
    process.join(_TERMINATE_GRACE_S)


def _worker_main(messages, spec: dict) -> None:
    """Runs in the spawned process: call the quantiser, send progress and the outcome."""
    try:
        options = spec["options"]
        if options.get("num_threads"):
            import torch

            torch.set_num_threads(options["num_threads"])
        module_name, func_name = spec["quantizer"].split(":")
        module = __import__(module_name, fromlist=[func_name])
        from quant.awq_pipeline import QuantizeJob as QuantSpec

        job = QuantSpec(
            source=spec["source"],
            out_dir=spec["out_dir"],
            calib_file=options["calib_file"],
            num_samples=options["num_samples"],
            seq_len=options["seq_len"],
            group_size=options["group_size"],
            device=options["device"],
        )
        started = time.monotonic()

        def progress(p) -> None:
            messages.put(("progress", p.layer, p.num_layers, time.monotonic() - started, p.eta_s))

        out = getattr(module, func_name)(job, progress)
        messages.put(("done", str(out)))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else traceback.format_exc(limit=3)
        messages.put(("error", detail))
