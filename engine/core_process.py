"""The engine loop in its own process: owns the model and the KV cache.

Started with the 'spawn' context (a forked child cannot use CUDA). It steps while any
request is unfinished and blocks on its input pipe when idle, so an idle engine costs
nothing. Each step sends the per-request deltas; a stats snapshot rides along at most
STATS_HZ times a second, plus one whenever the engine goes idle (so gauges such as KV
usage settle at their idle values) and a slow heartbeat while idle.

The pipes are the liveness signal both ways: if the client process dies, the input pipe
reports EOF and this process exits; if this process dies, the client sees EOF on the
output pipe.
"""

import atexit
import logging
import multiprocessing
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.ipc import (
    AbortRequests,
    AddRequest,
    EngineCrashed,
    EngineReady,
    RequestRejected,
    Shutdown,
    StartupFailed,
    StartupProgress,
    StepOutputs,
)
from engine.spawn import real_std_streams, redirect_output

STATS_HZ = 15.0
IDLE_HEARTBEAT_S = 1.0

logger = logging.getLogger(__name__)


def run_engine_core(config: EngineConfig, input_conn: Connection, output_conn: Connection,
                    log_path: str | None = None) -> None:
    """Process entry point (must be importable for 'spawn')."""
    if log_path is not None:
        redirect_output(log_path)
    # Ctrl-C reaches the whole process group; the client decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        core = _build_core(config, output_conn)
    except (EOFError, BrokenPipeError):
        sys.exit(0)  # the client went away while we loaded
    if core is None:
        sys.exit(1)
    try:
        EngineCoreLoop(core, input_conn, output_conn).run()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the client is gone: nobody to serve
    except BaseException as exc:
        try:
            output_conn.send(EngineCrashed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
        sys.exit(1)


def _build_core(config: EngineConfig, output_conn: Connection) -> EngineCore | None:
    ready_message = ""

    def progress(stage: str, message: str) -> None:
        nonlocal ready_message
        if stage == "ready":
            ready_message = message  # reported with EngineReady, once the client can use it
            return
        output_conn.send(StartupProgress(stage, message))

    try:
        core = EngineCore(config, progress)
    except Exception as exc:
        output_conn.send(StartupFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return None
    output_conn.send(
        EngineReady(
            model_dir=str(core.model_dir),
            max_model_len=core.max_model_len,
            vocab_size=core.model_config.vocab_size,
            num_blocks=core.block_manager.num_blocks,
            block_size=core.block_manager.block_size,
            device=str(config.torch_device),
            message=ready_message,
            stats=core.stats(),
        )
    )
    return core


class EngineCoreLoop:
    def __init__(self, core: EngineCore, input_conn: Connection, output_conn: Connection) -> None:
        self.core = core
        self.input_conn = input_conn
        self.output_conn = output_conn
        self.stats_interval = 1.0 / STATS_HZ
        self.last_stats_time = 0.0
        self.stats_dirty = False  # something changed since the last snapshot sent

    def run(self) -> None:
        while True:
            if not self.core.has_unfinished_requests():
                if self.stats_dirty:
                    self._send_stats()
                # Idle: sleep in the kernel until the client sends something.
                if not self.input_conn.poll(IDLE_HEARTBEAT_S):
                    self._send_stats()
                    continue
            while self.input_conn.poll():
                if not self._handle(self.input_conn.recv()):
                    return
            if not self.core.has_unfinished_requests():
                continue
            outputs = self.core.step()
            self.stats_dirty = True
            now = time.monotonic()
            stats = None
            if now - self.last_stats_time >= self.stats_interval:
                stats = self.core.stats()
                self.last_stats_time = now
                self.stats_dirty = False
            if outputs or stats is not None:
                self.output_conn.send(StepOutputs(outputs, stats))

    def _handle(self, message: object) -> bool:
        """Apply one client message; False means stop the loop."""
        if isinstance(message, AddRequest):
            try:
                self.core.add_request(message.request)
            except ValueError as exc:
                self.output_conn.send(RequestRejected(message.request.request_id, str(exc)))
            self.stats_dirty = True
        elif isinstance(message, AbortRequests):
            self.core.abort_requests(message.request_ids, message.status)
            self.stats_dirty = True
        elif isinstance(message, Shutdown):
            return False
        else:
            raise TypeError(f"unexpected message for the engine core: {type(message).__name__}")
        return True

    def _send_stats(self) -> None:
        self.output_conn.send(StepOutputs([], self.core.stats()))
        self.last_stats_time = time.monotonic()
        self.stats_dirty = False


# ---- the client's side of the process ------------------------------------------------
class EngineCoreProcess:
    """Parent-side handle: spawns the core, feeds its input pipe, reads its output pipe.

    `on_message(handle, message)` and `on_exit(handle)` are called from the reader thread;
    the caller hops to its own event loop. `on_exit` is called once, after the process has
    ended (or at least closed its end of the pipe), so the exit code is usually known.
    """

    def __init__(self, config: EngineConfig, on_message, on_exit,
                 log_path: str | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self._on_message = on_message
        self._on_exit = on_exit
        self._process = None
        self._input_writer: Connection | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> None:
        """Spawn the process (blocks for the fork/exec, not for the model load)."""
        ctx = multiprocessing.get_context("spawn")
        input_reader, input_writer = ctx.Pipe(duplex=False)
        output_reader, output_writer = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=run_engine_core,
            args=(self.config, input_reader, output_writer, self.log_path),
            name="kvdeck-engine-core",
            daemon=True,  # never outlives the client, even if shutdown() is skipped
        )
        with real_std_streams():
            self._process.start()
        _LIVE_PROCESSES.add(self)
        # Only the child may hold these ends, so that either side's death reads as EOF.
        input_reader.close()
        output_writer.close()
        self._input_writer = input_writer
        for target, arg, name in ((self._read_loop, output_reader, "reader"),
                                  (self._write_loop, input_writer, "writer")):
            thread = threading.Thread(target=target, args=(arg,), name=f"kvdeck-engine-{name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def send(self, message: object) -> None:
        """Queue a message for the core; never blocks the caller's event loop."""
        self._outbox.put(message)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the core to stop, then terminate, then kill; blocks until it is gone."""
        if self._process is None or self._process.pid is None:
            return  # never started
        self.send(Shutdown())
        self._outbox.put(_STOP_WRITER)
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(2.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(2.0)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(2.0)
        _LIVE_PROCESSES.discard(self)

    def kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(2.0)
        _LIVE_PROCESSES.discard(self)

    def _write_loop(self, conn: Connection) -> None:
        try:
            while (message := self._outbox.get()) is not _STOP_WRITER:
                conn.send(message)
        except OSError:
            pass  # the core is gone; the reader reports it
        finally:
            conn.close()  # the core reads EOF and exits if it is still running

    def _read_loop(self, conn: Connection) -> None:
        try:
            while True:
                self._on_message(self, conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
            self._outbox.put(_STOP_WRITER)
            if self._process is not None:
                self._process.join(2.0)  # reap it, so the exit code is known
            _LIVE_PROCESSES.discard(self)
            self._on_exit(self)


_STOP_WRITER = object()
_LIVE_PROCESSES: "weakref.WeakSet[EngineCoreProcess]" = weakref.WeakSet()


@atexit.register
def _stop_live_processes() -> None:
    """No orphan engine if the client's process exits without calling shutdown()."""
    for handle in list(_LIVE_PROCESSES):
        process = handle._process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(2.0)
            if process.is_alive():
                process.kill()
