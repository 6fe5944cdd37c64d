"""The subprocess core client: the EngineCore runs in a process of its own.

`CoreProcess` spawns it (by name, so this process never imports torch), feeds its input
pipe from a writer thread and reads its output pipe on a reader thread.
`on_message(handle, message)` and `on_exit(handle)` are called from the reader thread; the
caller hops to its own event loop. `on_exit` is called once, after the process has ended
(or at least closed its end of the pipe), so the exit code is usually known.

The pipes are the liveness signal both ways: if this process dies, the core reads EOF
and exits; if the core dies, the reader sees EOF.
"""

import atexit
import itertools
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from kvdeck.engine.core_client.spawn import SPAWN, start_process
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.wire import (
    UTILITY_METHODS,
    AbortRequests,
    AddRequest,
    EngineCoreRequest,
    RequestStatus,
    Shutdown,
    UtilityCall,
    UtilityResult,
)

UTILITY_TIMEOUT_S = 120.0  # a blocking call's longest wait (loading an adapter reads its file)

# The child's entry point, named rather than imported: it imports torch and the model code.
ENGINE_CORE_TARGET = "kvdeck.engine.core.loop:run_engine_core"

MessageHandler = Callable[["CoreProcess", object], None]
ExitHandler = Callable[["CoreProcess"], None]


class CoreProcess:
    def __init__(self, config: EngineConfig, on_message: MessageHandler, on_exit: ExitHandler,
                 log_path: str | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self._on_message = on_message
        self._on_exit = on_exit
        self._process: BaseProcess | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._call_ids = itertools.count(1)
        self._calls: dict[int, Future] = {}  # utility calls waiting for their answer
        self._calls_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    # ---- the core-client interface ------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        self.send(AddRequest(request))

    def abort_requests(self, request_ids: list[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.send(AbortRequests(list(request_ids), status))

    def call(self, method: str, *args: object) -> Future:
        """Call one of the core's utility methods (UTILITY_METHODS); a future of its result
        (ValueError with the core's reason if it failed, RuntimeError if the core is gone)."""
        if method not in UTILITY_METHODS:
            raise ValueError(f"unknown engine method {method!r}")
        future: Future = Future()
        with self._calls_lock:
            call_id = next(self._call_ids)
            self._calls[call_id] = future
        self.send(UtilityCall(call_id, method, args))
        return future

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter into the engine (blocking; AsyncLLM awaits `call` instead)."""
        return self.call("add_lora", lora_request).result(UTILITY_TIMEOUT_S)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.call("remove_lora", lora_int_id).result(UTILITY_TIMEOUT_S)

    def list_loras(self) -> list[int]:
        return self.call("list_loras").result(UTILITY_TIMEOUT_S)

    def _answer(self, message: UtilityResult) -> None:
        with self._calls_lock:
            future = self._calls.pop(message.call_id, None)
        if future is None:
            return
        if message.error is not None:
            future.set_exception(ValueError(message.error))
        else:
            future.set_result(message.result)

    def _fail_calls(self) -> None:
        with self._calls_lock:
            calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(RuntimeError("the engine process is gone"))

    # ---- the process ----------------------------------------------------------------
    def start(self) -> None:
        """Spawn the process (blocks for the spawn, not for the model load)."""
        input_reader, input_writer = SPAWN.Pipe(duplex=False)
        output_reader, output_writer = SPAWN.Pipe(duplex=False)
        self._process = start_process(ENGINE_CORE_TARGET, (self.config, input_reader, output_writer),
                                      log_path=self.log_path, name="kvdeck-engine-core")
        _LIVE_PROCESSES.add(self)
        # Only the child may hold these ends, so that either side's death reads as EOF.
        input_reader.close()
        output_writer.close()
        for target, conn, name in ((self._read_loop, output_reader, "reader"),
                                   (self._write_loop, input_writer, "writer")):
            thread = threading.Thread(target=target, args=(conn,), name=f"kvdeck-engine-{name}",
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
                message = conn.recv()
                if isinstance(message, UtilityResult):
                    self._answer(message)
                else:
                    self._on_message(self, message)
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
            self._fail_calls()
            self._outbox.put(_STOP_WRITER)
            if self._process is not None:
                self._process.join(2.0)  # reap it, so the exit code is known
            _LIVE_PROCESSES.discard(self)
            self._on_exit(self)


_STOP_WRITER = object()
_LIVE_PROCESSES: "weakref.WeakSet[CoreProcess]" = weakref.WeakSet()


@atexit.register
def _stop_live_processes() -> None:
    """No orphan engine if this process exits without stopping it."""
    for handle in list(_LIVE_PROCESSES):
        process = handle._process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(2.0)
            if process.is_alive():
                process.kill()
