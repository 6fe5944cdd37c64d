"""EngineClient: the async front of an EngineCore running in a background process.

The contract is .notes/CLIENT_API.md. Client-side work happens here, on the caller's
event loop: tokenising, chat templates, incremental detokenising and stop strings (the
OutputProcessor the offline engine uses too). The core sees token ids only.

A dead engine never hangs anyone: every pending stream and stats stream raises
EngineDeadError, health() says "dead" with the reason, and restart() starts a fresh
process.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig
from engine.core import EngineCoreRequest
from engine.core_process import EngineCoreProcess
from engine.ipc import (
    AbortRequests,
    AddRequest,
    EngineCrashed,
    EngineReady,
    RequestRejected,
    StartupFailed,
    StartupProgress,
    StepOutputs,
)
from engine.loader import resolve_model_path
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.parallel_sampling import require_one_choice
from engine.request import RequestStatus
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats
from engine.tokenizer import apply_chat_template, encode_prompt, load_tokenizer

logger = logging.getLogger(__name__)

DEMO_MODEL_NAME = "kvdeck-demo"
_STATS_BACKLOG = 32  # snapshots kept per slow stats reader (oldest dropped first)


class EngineDeadError(RuntimeError):
    """The engine process died (or was stopped) while requests were pending."""


class EngineStartError(RuntimeError):
    """The engine process could not start (bad model, out of memory, ...)."""


class EngineNotReadyError(RuntimeError):
    """A request arrived while the engine is still starting."""


@dataclass(slots=True)
class EngineHealth:
    status: str  # "starting" | "ready" | "dead" | "stopped"
    detail: str = ""


@dataclass(slots=True)
class _Stream:
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    has_output: bool = False


OutputListener = Callable[[RequestOutput], None]


class EngineClient:
    def __init__(self, model: str | None = None, *, log_path: str | None = None,
                 **engine_kwargs: object) -> None:
        self.config = EngineConfig.from_kwargs(model, **engine_kwargs)  # ValueError on bad knobs
        self.log_path = log_path  # where the engine process writes its output (None: inherit)
        self.model_name: str = model if model is not None else DEMO_MODEL_NAME
        self.max_model_len: int = 0
        self.vocab_size: int = 0
        self.num_blocks: int = 0
        self.model_dir: Path | None = None
        self.tokenizer = None
        self._tokenizer_eos: list[int] = []
        self._output_processor: OutputProcessor | None = None
        self._process: EngineCoreProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._on_progress: Callable[[StartupProgress], None] | None = None
        self._health = EngineHealth("stopped", "not started")
        self._failure = ""  # why the core said it failed, before its process ended
        self._streams: dict[str, _Stream] = {}
        self._stats_readers: set[asyncio.Queue] = set()
        self._output_listeners: list[OutputListener] = []
        self.last_stats: EngineStats | None = None

    # ---- lifecycle -----------------------------------------------------------------
    async def start(self, on_progress: Callable[[StartupProgress], None] | None = None) -> None:
        """Spawn the engine process; return once it is ready (EngineStartError if not)."""
        if self._health.status in ("starting", "ready"):
            raise RuntimeError(f"the engine is already {self._health.status}")
        self._on_progress = on_progress
        self._loop = asyncio.get_running_loop()
        self._failure = ""
        self._health = EngineHealth("starting", "starting the engine process")
        self._report(StartupProgress("starting", "starting the engine process"))
        try:
            if self.tokenizer is None:
                self.model_dir = await asyncio.to_thread(resolve_model_path, self.config.model)
                if not (self.model_dir / "config.json").is_file():
                    raise EngineStartError(f"{self.model_dir} has no config.json: not a model")
                tokenizer = await asyncio.to_thread(load_tokenizer, self.model_dir,
                                                    self.config.tokenizer)
                self._set_tokenizer(tokenizer)
            self._ready = self._loop.create_future()
            process = EngineCoreProcess(self.config, self._from_reader_thread(self._on_message),
                                        self._from_reader_thread(self._on_exit), self.log_path)
            self._process = process
            await asyncio.to_thread(process.start)
            ready: EngineReady = await self._ready
        except asyncio.CancelledError:
            await self._stop_process()
            self._health = EngineHealth("stopped", "start-up was cancelled")
            raise
        except Exception as exc:
            await self._stop_process()
            detail = str(exc)
            if not isinstance(exc, EngineStartError):
                detail = f"{type(exc).__name__}: {exc}"
            self._health = EngineHealth("dead", detail)
            raise EngineStartError(detail) from exc
        self.max_model_len = ready.max_model_len
        self.vocab_size = ready.vocab_size
        self.num_blocks = ready.num_blocks
        self.last_stats = ready.stats
        self._health = EngineHealth("ready", f"{ready.message} on {ready.device}".strip())
        self._report(StartupProgress("ready", ready.message or "ready"))

    async def restart(self) -> None:
        """Start a fresh engine process (after a crash, or to reload)."""
        if self._process is not None:
            await self.shutdown()
        await self.start(self._on_progress)

    async def shutdown(self) -> None:
        """Stop the engine process; pending requests end with finish_reason "abort"."""
        if self._process is None:
            if self._health.status != "dead":
                self._health = EngineHealth("stopped", "shut down")
            return
        self._health = EngineHealth("stopped", "shut down")
        for request_id in list(self._streams):
            self._finish_aborted(request_id)
        for reader in self._stats_readers:
            _put_latest(reader, None)
        await self._stop_process()

    async def _stop_process(self) -> None:
        process, self._process = self._process, None
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineStartError("the engine was stopped during start-up"))
            self._ready.exception()  # mark retrieved
        if process is not None:
            await asyncio.to_thread(process.stop)

    def health(self) -> EngineHealth:
        return EngineHealth(self._health.status, self._health.detail)

    @property
    def pid(self) -> int | None:
        """The engine process id (None when not running)."""
        return self._process.pid if self._process is not None else None

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    @property
    def num_waiting(self) -> int:
        """Requests sent to the engine that have not produced their first token yet."""
        return sum(1 for s in self._streams.values() if not s.has_output)

    def add_output_listener(self, listener: OutputListener) -> None:
        """Called on the event loop with every RequestOutput (metrics, logging)."""
        self._output_listeners.append(listener)

    # ---- requests ------------------------------------------------------------------
    def encode(self, prompt: str | list[int] | None = None,
               messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as generate() would send them; ValueError on bad input."""
        if self.tokenizer is None:
            raise EngineNotReadyError("the engine has not been started")
        if messages is not None:
            if prompt is not None:
                raise ValueError("give either prompt or messages, not both")
            return None, apply_chat_template(self.tokenizer, messages)
        if prompt is None:
            raise ValueError("prompt or messages is required")
        return encode_prompt(self.tokenizer, prompt)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The core's admission checks, done here so bad input fails before it is queued."""
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        params.validate()
        require_one_choice(params)
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        if self.max_model_len and len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens; max_model_len is "
                f"{self.max_model_len}, which must leave room for at least one generated token"
            )
        if self.vocab_size:
            vocab = self.vocab_size
            if any(not 0 <= t < vocab for t in prompt_token_ids):
                raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
            if any(t >= vocab for t in params.stop_token_ids):
                raise ValueError(f"stop_token_ids must be in [0, {vocab})")

    def add_request(
        self,
        prompt: str | list[int] | None,
        params: SamplingParams,
        request_id: str | None = None,
        messages: list[dict] | None = None,
    ) -> "RequestStream":
        """Queue a request now and return its stream (closing the stream early aborts it).

        Synchronous, so a caller can check capacity and queue without another task
        slipping in between. ValueError for bad input, before anything is queued.
        """
        self._require_ready()
        prompt_text, prompt_ids = self.encode(prompt, messages)
        self.check_request(prompt_ids, params)
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        stream = _Stream()
        arrival_time = time.time()
        self._streams[request_id] = stream
        self._output_processor.add_request(request_id, prompt_text, prompt_ids, params,
                                           arrival_time)
        self._process.send(AddRequest(EngineCoreRequest(
            request_id, prompt_ids, params, arrival_time, list(self._tokenizer_eos))))
        return RequestStream(self, request_id, stream)

    async def generate(
        self,
        prompt: str | list[int] | None,
        params: SamplingParams,
        request_id: str | None = None,
        messages: list[dict] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; leaving the loop early aborts the request."""
        stream = self.add_request(prompt, params, request_id, messages)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        """Stop a request now; its blocks are freed and its stream ends with "abort"."""
        self._finish_aborted(request_id)

    async def stats_stream(self) -> AsyncIterator[EngineStats]:
        """EngineStats snapshots (~15/s while busy, 1/s idle); EngineDeadError if it dies."""
        if self._health.status == "dead":
            raise EngineDeadError(self._health.detail)
        reader: asyncio.Queue = asyncio.Queue(maxsize=_STATS_BACKLOG)
        self._stats_readers.add(reader)
        try:
            if self.last_stats is not None and self._health.status == "ready":
                yield self.last_stats
            while True:
                item = await reader.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stats_readers.discard(reader)

    # ---- internals -----------------------------------------------------------------
    def _require_ready(self) -> None:
        status = self._health.status
        if status == "ready":
            return
        if status == "starting":
            raise EngineNotReadyError("the engine is still starting")
        raise EngineDeadError(f"the engine is {status}: {self._health.detail}")

    def _set_tokenizer(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._output_processor = OutputProcessor(tokenizer)
        eos = getattr(tokenizer, "eos_token_id", None)
        self._tokenizer_eos = [eos] if isinstance(eos, int) else []

    def _report(self, progress: StartupProgress) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress(progress)
        except Exception:  # a broken progress display must not break start-up
            logger.exception("startup progress callback failed")

    def _abort_in_engine(self, request_id: str) -> RequestOutput | None:
        if self._process is not None and self._health.status == "ready":
            self._process.send(AbortRequests([request_id]))
        out = self._output_processor.abort(request_id) if self._output_processor else None
        if out is not None:
            self._notify(out)
        return out

    def _finish_aborted(self, request_id: str) -> None:
        out = self._abort_in_engine(request_id)
        stream = self._streams.pop(request_id, None)
        if out is not None and stream is not None:
            stream.queue.put_nowait(out)

    def _notify(self, out: RequestOutput) -> None:
        for listener in self._output_listeners:
            try:
                listener(out)
            except Exception:
                logger.exception("output listener failed")

    def _from_reader_thread(self, handler: Callable) -> Callable:
        """Run a reader-thread callback on our event loop instead."""
        loop = self._loop

        def call(*args: object) -> None:
            try:
                loop.call_soon_threadsafe(handler, *args)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

        return call

    def _on_message(self, process: EngineCoreProcess | None, message: object) -> None:
        if process is not self._process:
            return  # a message from a process we already replaced or stopped
        if isinstance(message, StepOutputs):
            self._on_step_outputs(message)
        elif isinstance(message, StartupProgress):
            self._report(message)
        elif isinstance(message, EngineReady):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif isinstance(message, StartupFailed):
            self._failure = message.message
            logger.error("engine start-up failed:\n%s", message.traceback)
        elif isinstance(message, RequestRejected):
            self._output_processor.abort(message.request_id)
            stream = self._streams.pop(message.request_id, None)
            if stream is not None:
                stream.queue.put_nowait(ValueError(message.message))
        elif isinstance(message, EngineCrashed):
            self._failure = f"the engine crashed: {message.message}"
            logger.error("engine crashed:\n%s", message.traceback)

    def _on_step_outputs(self, message: StepOutputs) -> None:
        if message.outputs:
            outputs, stopped = self._output_processor.process(message.outputs)
            if stopped:  # stop strings matched here: free their blocks in the core
                self._process.send(AbortRequests(stopped, RequestStatus.FINISHED_STOPPED))
            for out in outputs:
                self._notify(out)
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.has_output = True
                    stream.queue.put_nowait(out)
                    if out.finished:
                        del self._streams[out.request_id]
        if message.stats is not None:
            self.last_stats = message.stats
            for reader in self._stats_readers:
                _put_latest(reader, message.stats)

    def _on_exit(self, process: EngineCoreProcess | None) -> None:
        if process is not self._process:
            return  # shutdown() or restart() already took care of it
        code = process.exitcode
        detail = self._failure or (
            f"the engine process exited unexpectedly ({_describe_exit(code)})"
        )
        self._process = None
        self._health = EngineHealth("dead", detail)
        logger.error("engine is dead: %s", detail)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineStartError(detail))
        for request_id, stream in list(self._streams.items()):
            self._output_processor.abort(request_id)
            stream.queue.put_nowait(EngineDeadError(detail))
        self._streams.clear()
        for reader in self._stats_readers:
            _put_latest(reader, EngineDeadError(detail))


class RequestStream:
    """The outputs of one queued request, as an async iterator.

    Ends after the finished output; raises EngineDeadError if the engine dies, ValueError
    if the core refused the request. aclose() before the end aborts the request.
    """

    def __init__(self, client: EngineClient, request_id: str, stream: _Stream) -> None:
        self.request_id = request_id
        self._client = client
        self._stream = stream
        self._done = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._stream.queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def cancel(self) -> None:
        """Abort the request unless it already ended (idempotent)."""
        if not self._done:
            self._done = True
            self._client._streams.pop(self.request_id, None)
            self._client._abort_in_engine(self.request_id)

    async def aclose(self) -> None:
        self.cancel()  # the caller stopped listening (cancelled, closed, broke out)


def _put_latest(reader: asyncio.Queue, item: object) -> None:
    if reader.full():
        reader.get_nowait()  # a slow reader sees the newest snapshots, not a growing backlog
    reader.put_nowait(item)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


__all__ = [
    "EngineClient",
    "EngineDeadError",
    "EngineHealth",
    "EngineNotReadyError",
    "EngineStartError",
    "StartupProgress",
]
