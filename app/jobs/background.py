"""Run a heavy function (quantise, evaluate) in a spawned process, with messages and cancel.

The worker is `module:function(spec, emit) -> result`; `emit(message)` reaches the parent's
`on_message` (in a monitor thread), the result its `on_success`. Cancel terminates the
process at once. A job's `scratch` directory (where the worker writes) is removed whatever
the outcome, so a cancelled or failed job leaves nothing behind; `on_success` moves out
what should be kept first.
"""

import importlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.engine.core_client.spawn import SPAWN, real_std_streams, start_process

WORKER_MAIN = "kvdeck.app.jobs.background:run_worker"
_POLL_S = 0.1
_TERMINATE_GRACE_S = 5.0


@dataclass(slots=True)
class BackgroundJob:
    scratch: Path | None
    on_message: Callable[[tuple], None]
    on_success: Callable[[object], None]
    on_end: Callable[["BackgroundJob"], None]
    error: str | None = None
    cancelled: bool = False
    _process: mp.process.BaseProcess | None = None
    _queue: object = None
    _cancel_requested: threading.Event = field(default_factory=threading.Event)
    _finished: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def process_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has ended (and its scratch is gone)."""
        return self._finished.wait(timeout)

    def wait_or_raise(self, timeout: float | None, what: str) -> None:
        """Block until the job ends. TimeoutError names `what` if it is still running;
        RuntimeError carries the worker's message if it failed."""
        if not self.wait(timeout):
            raise TimeoutError(f"{what} still running")
        if self.error is not None:
            raise RuntimeError(self.error)

    def cancel(self) -> None:
        """Terminate the worker and wait until everything it wrote is removed."""
        self._cancel_requested.set()
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()
        self._finished.wait(_TERMINATE_GRACE_S * 2 + 5)


def start_background(
    worker: str,
    spec: dict,
    scratch: Path | None,
    on_message: Callable[[tuple], None],
    on_success: Callable[[object], None],
    on_end: Callable[[BackgroundJob], None],
) -> BackgroundJob:
    job = BackgroundJob(scratch, on_message, on_success, on_end)
    # The worker must never write into the terminal the TUI draws on: its output goes to a log.
    log = str(scratch / "worker.log") if scratch is not None else os.devnull
    with real_std_streams():  # the queue's semaphore may start multiprocessing's tracker
        job._queue = SPAWN.Queue()
    job._process = start_process(WORKER_MAIN, (job._queue, worker, spec), log_path=log)
    threading.Thread(target=_monitor, args=(job,), daemon=True).start()
    return job


def _monitor(job: BackgroundJob) -> None:
    process = job._process
    assert process is not None
    outcome: tuple | None = None
    while outcome is None and not job._cancel_requested.is_set():
        try:
            kind, payload = job._queue.get(timeout=_POLL_S)
        except queue.Empty:
            if process.is_alive():
                continue
            try:  # the last message may have landed just before the exit
                kind, payload = job._queue.get(timeout=_POLL_S)
            except queue.Empty:
                outcome = ("error", f"the worker exited with code {process.exitcode}"
                           + _log_tail(job.scratch))  # fmt: skip
                break
        if kind == "message":
            job.on_message(payload)
        else:
            outcome = (kind, payload)
    _stop(process)
    try:
        if job._cancel_requested.is_set():
            job.cancelled = True
        elif outcome[0] == "done":
            try:
                job.on_success(outcome[1])
            except Exception as exc:  # noqa: BLE001 - reported as the job's error
                job.error = f"{type(exc).__name__}: {exc}"
        else:
            job.error = outcome[1]
    finally:
        if job.scratch is not None:
            shutil.rmtree(job.scratch, ignore_errors=True)
        job.on_end(job)
        job._finished.set()


def _stop(process: mp.process.BaseProcess) -> None:
    if process.is_alive():
        process.terminate()
        process.join(_TERMINATE_GRACE_S)
    if process.is_alive():
        process.kill()
    process.join(_TERMINATE_GRACE_S)


def _log_tail(scratch: Path | None, lines: int = 5) -> str:
    if scratch is None:
        return ""
    try:
        tail = (scratch / "worker.log").read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return (": " + " | ".join(tail)) if tail else ""


class _Terminated(BaseException):
    """SIGTERM (a cancel) as an exception, so the process unwinds and exits cleanly."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def run_worker(messages, worker: str, spec: dict) -> None:
    """In the spawned process: run the worker, send its messages and its outcome.

    A cancel terminates this process. Dying of the signal would skip multiprocessing's
    exit finalizers, and a lock something made here (tqdm's, while transformers loads a
    model) would stay registered with the resource tracker, which then warns of a "leaked
    semaphore" when the app exits; so SIGTERM unwinds the process instead.
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        module_name, func_name = worker.split(":")
        func = getattr(importlib.import_module(module_name), func_name)
        result = func(spec, lambda message: messages.put(("message", message)))
        messages.put(("done", result))
    except _Terminated:
        sys.exit(143)  # cancelled: nobody waits for an outcome
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else traceback.format_exc(limit=3)
        messages.put(("error", detail))
