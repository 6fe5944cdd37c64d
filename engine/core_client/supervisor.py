"""The supervisor of the core's process: starts it, watches it, stops it, says how it is.

Runs on the caller's asyncio loop; the process's reader thread hops onto that loop. A dead
engine never hangs anyone: start-up failures raise `EngineStartError`, a crash turns the
health to DEAD with the reason and calls `on_death`, and `start()` can run again.
"""

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from kvdeck.engine.core_client.process import CoreProcess
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.wire import EngineCrashed, EngineReady, StartupFailed, StartupProgress

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine process died (or was stopped) while requests were pending."""


class EngineStartError(RuntimeError):
    """The engine process could not start (bad model, out of memory, ...)."""


class EngineNotReadyError(RuntimeError):
    """A request arrived while the engine is still starting."""


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"  # failed to start, or crashed
    STOPPED = "stopped"  # never started, or shut down


@dataclass(slots=True, frozen=True)
class EngineHealth:
    status: EngineState
    detail: str = ""


ProgressListener = Callable[[StartupProgress], None]


class ProcessSupervisor:
    """`on_message(message)`: every message after start-up (step outputs, rejections),
    on the loop. `on_death(detail)`: the process ended without being asked to."""

    def __init__(self, config: EngineConfig, log_path: str | None,
                 on_message: Callable[[object], None], on_death: Callable[[str], None]) -> None:
        self.config = config
        self.log_path = log_path
        self._on_message = on_message
        self._on_death = on_death
        self.process: CoreProcess | None = None
        self.health = EngineHealth(EngineState.STOPPED, "not started")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._on_progress: ProgressListener | None = None
        self._failure = ""  # why the core said it failed, before its process ended

    async def start(self, on_progress: ProgressListener | None,
                    prepare: Callable[[], Awaitable[None]]) -> EngineReady:
        """Run `prepare()` (the front-end's own loading), spawn the core and wait until it
        is ready; EngineStartError (and a DEAD health) if anything fails."""
        if self.health.status in (EngineState.STARTING, EngineState.READY):
            raise RuntimeError(f"the engine is already {self.health.status}")
        self._on_progress = on_progress
        self._loop = asyncio.get_running_loop()
        self._failure = ""
        self.health = EngineHealth(EngineState.STARTING, "starting the engine process")
        self.report(StartupProgress("starting", "starting the engine process"))
        try:
            await prepare()
            self._ready = self._loop.create_future()
            process = CoreProcess(self.config, self._from_reader_thread(self._dispatch),
                                  self._from_reader_thread(self._on_exit), self.log_path)
            self.process = process
            await asyncio.to_thread(process.start)
            ready: EngineReady = await self._ready
        except asyncio.CancelledError:
            await self._stop_process()
            self.health = EngineHealth(EngineState.STOPPED, "start-up was cancelled")
            raise
        except Exception as exc:
            await self._stop_process()
            detail = str(exc) if isinstance(exc, EngineStartError) else f"{type(exc).__name__}: {exc}"
            self.health = EngineHealth(EngineState.DEAD, detail)
            raise EngineStartError(detail) from exc
        self.health = EngineHealth(EngineState.READY, f"{ready.message} on {ready.info.device}".strip())
        self.report(StartupProgress("ready", ready.message or "ready"))
        return ready

    async def stop(self) -> None:
        """Stop the process (idempotent); health STOPPED unless it already died."""
        if self.process is None:
            if self.health.status is not EngineState.DEAD:
                self.health = EngineHealth(EngineState.STOPPED, "shut down")
            return
        self.health = EngineHealth(EngineState.STOPPED, "shut down")
        await self._stop_process()

    def require_ready(self) -> CoreProcess:
        status = self.health.status
        if status is EngineState.READY and self.process is not None:
            return self.process
        if status is EngineState.STARTING:
            raise EngineNotReadyError("the engine is still starting")
        raise EngineDeadError(f"the engine is {status}: {self.health.detail}")

    def report(self, progress: StartupProgress) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress(progress)
        except Exception:  # a broken progress display must not break start-up
            logger.exception("startup progress callback failed")

    # ---- internals -----------------------------------------------------------------
    async def _stop_process(self) -> None:
        process, self.process = self.process, None
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineStartError("the engine was stopped during start-up"))
            self._ready.exception()  # mark retrieved
        if process is not None:
            await asyncio.to_thread(process.stop)

    def _from_reader_thread(self, handler: Callable) -> Callable:
        """Run a reader-thread callback on the supervisor's event loop instead."""
        loop = self._loop

        def call(*args: object) -> None:
            try:
                loop.call_soon_threadsafe(handler, *args)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

        return call

    def _dispatch(self, process: CoreProcess, message: object) -> None:
        if process is not self.process:
            return  # a message from a process we already replaced or stopped
        match message:
            case StartupProgress():
                self.report(message)
            case EngineReady():
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(message)
            case StartupFailed(text, trace):
                self._failure = text
                logger.error("engine start-up failed:\n%s", trace)
            case EngineCrashed(text, trace):
                self._failure = f"the engine crashed: {text}"
                logger.error("engine crashed:\n%s", trace)
            case _:
                self._on_message(message)

    def _on_exit(self, process: CoreProcess) -> None:
        if process is not self.process:
            return  # stop() or a restart already took care of it
        exit_text = describe_exit(process.exitcode)
        detail = self._failure or f"the engine process exited unexpectedly ({exit_text})"
        self.process = None
        self.health = EngineHealth(EngineState.DEAD, detail)
        logger.error("engine is dead: %s", detail)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineStartError(detail))
        self._on_death(detail)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
