"""EngineClient: the async front of an EngineCore running in a background process.

Three parts, each in its own file: the process supervisor (start, stop, restart, health),
the front-end (tokenise, check, detokenise, stop strings; the same one the offline engine
uses) and the stream registry (one async stream per request, stats fan-out). Everything
runs on the caller's event loop; nothing here imports torch.

A dead engine never hangs anyone: every pending stream and stats stream raises
EngineDeadError, health() says DEAD with the reason, and restart() starts a fresh process.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvdeck.engine.api.streams import RequestFailedError, RequestStream, StreamRegistry
from kvdeck.engine.client.supervisor import (
    EngineDeadError,
    EngineHealth,
    EngineNotReadyError,
    EngineStartError,
    EngineState,
    ProcessSupervisor,
    ProgressListener,
)
from kvdeck.engine.frontend.frontend import Frontend, Prompt, checked_grammar
from kvdeck.engine.frontend.tokenizer import load_tokenizer
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.model_path import resolve_model_path
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats
from kvdeck.engine.types.wire import EngineInfo, RequestRejected, StartupProgress, StepOutputs

logger = logging.getLogger(__name__)

DEMO_MODEL_NAME = "kvdeck-demo"

OutputListener = Callable[[RequestOutput], None]


class EngineClient:
    def __init__(self, model: str | None = None, *, log_path: str | None = None,
                 **engine_kwargs: object) -> None:
        self.config = EngineConfig.from_kwargs(model, **engine_kwargs)  # ValueError on bad knobs
        self.model_name: str = model if model is not None else DEMO_MODEL_NAME
        self.max_model_len: int = 0
        self.vocab_size: int = 0
        self.num_blocks: int = 0
        self.model_dir: Path | None = None
        self.tokenizer = None
        self.info: EngineInfo | None = None  # what the running engine is (set at ready)
        self.last_stats: EngineStats | None = None
        self._supervisor = ProcessSupervisor(self.config, log_path, self._on_message, self._on_death)
        self._frontend: Frontend | None = None
        self._streams = StreamRegistry()
        self._output_listeners: list[OutputListener] = []
        self._step_listeners: list[Callable[[list[int]], None]] = []
        self._on_progress: ProgressListener | None = None
        # Tokenising and chat templates run here, one at a time (fast tokenizers must not be
        # used from two threads at once), so a long prompt never stalls the event loop.
        self._tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvdeck-tokenize")

    # ---- lifecycle -----------------------------------------------------------------
    async def start(self, on_progress: ProgressListener | None = None) -> None:
        """Spawn the engine process; return once it is ready (EngineStartError if not)."""
        self._on_progress = on_progress
        ready = await self._supervisor.start(on_progress, self._load_tokenizer)
        info = self.info = ready.info
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self.num_blocks = info.num_blocks
        self.last_stats = ready.stats
        self._frontend = Frontend(self.tokenizer, self._supervisor.require_ready(),
                                  RequestLimits(info.max_model_len, info.vocab_size))

    async def _load_tokenizer(self) -> None:
        if self.tokenizer is not None:
            return
        self.model_dir = await asyncio.to_thread(resolve_model_path, self.config.model)
        if not (self.model_dir / "config.json").is_file():
            raise EngineStartError(f"{self.model_dir} has no config.json: not a model")
        self.tokenizer = await asyncio.to_thread(load_tokenizer, self.model_dir, self.config.tokenizer)

    async def restart(self) -> None:
        """Start a fresh engine process (after a crash, or to reload)."""
        if self._supervisor.process is not None:
            await self.shutdown()
        await self.start(self._on_progress)

    async def shutdown(self) -> None:
        """Stop the engine process; pending requests end with finish_reason "abort"."""
        if self._supervisor.process is not None:
            for request_id in list(self._streams.streams):
                self._finish_aborted(request_id)
            self._streams.publish_stats(None)
        await self._supervisor.stop()

    def health(self) -> EngineHealth:
        return self._supervisor.health

    @property
    def pid(self) -> int | None:
        """The engine process id (None when not running)."""
        process = self._supervisor.process
        return process.pid if process is not None else None

    @property
    def num_unfinished(self) -> int:
        return len(self._streams.streams)

    @property
    def num_waiting(self) -> int:
        """Requests sent to the engine that have not produced their first token yet."""
        return self._streams.num_waiting

    def add_output_listener(self, listener: OutputListener) -> None:
        """Called on the event loop with every RequestOutput (metrics, logging)."""
        self._output_listeners.append(listener)

    def add_step_listener(self, listener: Callable[[list[int]], None]) -> None:
        """Called on the event loop with the tokens computed by each engine step."""
        self._step_listeners.append(listener)

    # ---- requests ------------------------------------------------------------------
    def encode(self, prompt: Prompt | None = None,
               messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as generate() would send them; ValueError on bad input."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        return self._frontend.encode(prompt, messages)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The engine's admission checks (ValueError naming the problem), for callers that
        prepare several requests before queueing any."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        self._frontend.limits.check(prompt_token_ids, params)

    async def encode_async(self, prompt: Prompt | None = None, messages: list[dict] | None = None,
                           tools: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """`encode` off the event loop (in the tokenizer's thread); `tools` go to the chat
        template."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self._frontend.encode, prompt,
                                          messages, tools)

    async def encode_async_plain(self, text: str) -> list[int]:
        """Token ids of `text` without the special tokens the tokenizer would add."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        frontend = self._frontend
        frontend.check_text(text, "prompt")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._tokenize_pool, lambda: frontend.tokenizer.encode(text, add_special_tokens=False))

    async def check_grammar_async(self, params: SamplingParams) -> None:
        """Check a structured-outputs spec off the event loop (ValueError quoting the grammar
        library); `add_request` then finds it checked."""
        if params.structured_outputs is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._tokenize_pool, checked_grammar, params.structured_outputs)

    async def decode_async(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise EngineNotReadyError("the engine has not been started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self.tokenizer.decode, token_ids)

    def add_request(self, prompt: Prompt | None, params: SamplingParams,
                    request_id: str | None = None, messages: list[dict] | None = None) -> RequestStream:
        """Queue a request now and return its stream (closing the stream early aborts it).

        Synchronous, so a caller can check capacity and queue without another task
        slipping in between (pass token ids, from `encode_async`, to keep the tokenising
        off the loop). ValueError for bad input, before anything is queued.
        """
        self._supervisor.require_ready()
        frontend = self._frontend
        assert frontend is not None
        prompt_text, prompt_ids = frontend.encode(prompt, messages)
        return self._add_encoded(request_id, prompt_text, prompt_ids, params)

    def _add_encoded(self, request_id: str | None, prompt_text: str | None, prompt_ids: list[int],
                     params: SamplingParams) -> RequestStream:
        self._supervisor.require_ready()
        frontend = self._frontend
        assert frontend is not None
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        if request_id in self._streams.streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        frontend.add_encoded(request_id, prompt_text, prompt_ids, params, arrival_time=time.time())
        stream = self._streams.open(request_id)
        return RequestStream(request_id, stream, self._cancel)

    async def generate(self, prompt: Prompt | None, params: SamplingParams,
                       request_id: str | None = None,
                       messages: list[dict] | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; leaving the loop early aborts the request.
        Tokenising runs off the event loop."""
        self._supervisor.require_ready()
        prompt_text, prompt_ids = await self.encode_async(prompt, messages)
        stream = self._add_encoded(request_id, prompt_text, prompt_ids, params)
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
        health = self._supervisor.health
        if health.status is EngineState.DEAD:
            raise EngineDeadError(health.detail)
        first = self.last_stats if health.status is EngineState.READY else None
        async for stats in self._streams.read_stats(first):
            yield stats

    # ---- internals -----------------------------------------------------------------
    def _abort_in_engine(self, request_id: str) -> RequestOutput | None:
        if self._frontend is None:
            return None
        ready = self._supervisor.health.status is EngineState.READY
        for out in self._frontend.abort([request_id], tell_core=ready):
            self._notify(out)
            return out
        return None

    def _cancel(self, request_id: str) -> None:
        """A stream was closed early: abort silently (nobody reads the stream any more)."""
        self._streams.end(request_id)
        self._abort_in_engine(request_id)

    def _finish_aborted(self, request_id: str) -> None:
        out = self._abort_in_engine(request_id)
        self._streams.end(request_id, out)

    def _notify(self, out: RequestOutput) -> None:
        for listener in self._output_listeners:
            try:
                listener(out)
            except Exception:
                logger.exception("output listener failed")

    def _on_message(self, message: object) -> None:
        match message:
            case StepOutputs(outputs, stats, iteration_tokens):
                if iteration_tokens:
                    for step_listener in self._step_listeners:
                        step_listener(iteration_tokens)
                if outputs and self._frontend is not None:
                    for out in self._frontend.process_outputs(outputs):
                        self._notify(out)
                        self._streams.deliver(out)
                if stats is not None:
                    self.last_stats = stats
                    self._streams.publish_stats(stats)
            case RequestRejected(request_id, text):
                if self._frontend is not None:
                    self._frontend.abort([request_id], tell_core=False)
                self._streams.end(request_id, ValueError(text))
            case _:
                logger.warning("unexpected message from the engine: %s", type(message).__name__)

    def _on_death(self, detail: str) -> None:
        error = EngineDeadError(detail)
        lost = self._streams.end_all(error)
        if self._frontend is not None:
            # Their last word: finished with "error", so listeners (metrics) count them.
            lost += [rid for rid in list(self._frontend.output_processor.states) if rid not in lost]
            for out in self._frontend.abort(lost, tell_core=False, error=detail):
                self._notify(out)
        self._streams.publish_stats(error)


__all__ = [
    "EngineClient",
    "EngineDeadError",
    "EngineHealth",
    "EngineNotReadyError",
    "EngineStartError",
    "EngineState",
    "RequestFailedError",
    "RequestStream",
    "StartupProgress",
]
