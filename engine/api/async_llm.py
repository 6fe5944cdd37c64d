"""AsyncLLM (vLLM v1's name): the async engine, over an EngineCore in a process of its own.

Three parts, each in its own file: the process supervisor (start, stop, restart, health),
the front-end (tokenise, check, fan out n choices, detokenise, stop strings; the same one
the offline engine uses) and the stream registry (one async stream per request, stats
fan-out). A caller hands a request over with one call, `add_request` (or `generate`), and
reads its outputs from the stream. Everything runs on the caller's event loop; nothing
here imports torch.

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
from kvdeck.engine.core_client.supervisor import (
    EngineDeadError,
    EngineHealth,
    EngineNotReadyError,
    EngineStartError,
    EngineState,
    ProcessSupervisor,
    ProgressListener,
)
from kvdeck.engine.frontend.frontend import Admit, Frontend, Prompt, checked_grammar
from kvdeck.engine.frontend.tokenizer import load_tokenizer
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import LoRARequest, check_lora_request
from kvdeck.engine.types.model_path import resolve_model_path
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats
from kvdeck.engine.types.wire import EngineInfo, RequestRejected, StartupProgress, StepOutputs

logger = logging.getLogger(__name__)

DEMO_MODEL_NAME = "kvdeck-demo"

OutputListener = Callable[[RequestOutput], None]
# (tokens of each step since the previous call, the engine's step count after the last,
# the KV blocks held after each of those steps)
StepListener = Callable[[list[int], int, list[int]], None]


class AsyncLLM:
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
        self._step_listeners: list[StepListener] = []
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
                                  RequestLimits(info.max_model_len, info.vocab_size), self._notify)

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
        """Engine requests (choices) sent that have not produced their first token yet."""
        return self._frontend.num_waiting if self._frontend is not None else 0

    def add_output_listener(self, listener: OutputListener) -> None:
        """Called on the event loop with every engine request's output (one choice each,
        under its engine request id): metrics, logging."""
        self._output_listeners.append(listener)

    def add_step_listener(self, listener: StepListener) -> None:
        """Called on the event loop with the tokens computed by each engine step since the
        previous call, the engine's step count after the last of them, and the KV blocks held
        after each of them (empty from an engine that does not say)."""
        self._step_listeners.append(listener)

    # ---- requests ------------------------------------------------------------------
    def encode(self, prompt: Prompt | None = None, messages: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as generate() would send them; ValueError on bad input."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        return self._frontend.encode(prompt, messages, template_kwargs=chat_template_kwargs)

    async def encode_async(self, prompt: Prompt | None = None, messages: list[dict] | None = None,
                           tools: list[dict] | None = None,
                           chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        """`encode` off the event loop (in the tokenizer's thread); `tools` and
        `chat_template_kwargs` go to the chat template."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self._frontend.encode, prompt,
                                          messages, tools, chat_template_kwargs)

    async def encode_async_plain(self, text: str) -> list[int]:
        """Token ids of `text` without the special tokens the tokenizer would add."""
        if self._frontend is None:
            raise EngineNotReadyError("the engine has not been started")
        frontend = self._frontend
        frontend.check_text(text, "prompt")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._tokenize_pool, lambda: frontend.tokenizer.encode(text, add_special_tokens=False))

    async def decode_async(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise EngineNotReadyError("the engine has not been started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self.tokenizer.decode, token_ids)

    async def add_request(self, request_id: str | None, prompt: Prompt | None,
                          params: SamplingParams, *, messages: list[dict] | None = None,
                          tools: list[dict] | None = None, admit: Admit | None = None,
                          lora_request: LoRARequest | None = None,
                          chat_template_kwargs: dict | None = None) -> RequestStream:
        """Hand one request (its n choices) to the engine; its stream (closing the stream
        early aborts every choice). Tokenising, the chat template (with `tools`) and the
        grammar check run off the event loop; ValueError (PromptError, GrammarError), with
        nothing queued, for bad input. `admit(prompt_ids, params)`: the caller's last word,
        called after the engine's checks with no await before the request is queued (a
        server's queue limit); it may set params.max_tokens, or raise to refuse.
        `lora_request`: the adapter it runs under (ValueError with LoRA off; the core loads an
        adapter it does not hold, and refuses a bad one: the stream raises ValueError).
        `chat_template_kwargs`: more variables for the chat template (`enable_thinking`)."""
        self._supervisor.require_ready()
        check_lora_request(lora_request, self.config.enable_lora)
        loop = asyncio.get_running_loop()
        prompt_text, prompt_ids = await loop.run_in_executor(
            self._tokenize_pool, _tokenize, self._frontend, prompt, messages, tools, params,
            chat_template_kwargs)
        self._supervisor.require_ready()  # it may have stopped meanwhile
        frontend = self._frontend
        assert frontend is not None
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        frontend.add_encoded(request_id, prompt_text, prompt_ids, params, arrival_time=time.time(),
                              admit=admit, lora_request=lora_request)
        return RequestStream(request_id, prompt_ids, self._streams.open(request_id), self._cancel)

    async def generate(self, prompt: Prompt | None, params: SamplingParams,
                       request_id: str | None = None, messages: list[dict] | None = None,
                       lora_request: LoRARequest | None = None,
                       chat_template_kwargs: dict | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs; leaving the loop early aborts the request."""
        stream = await self.add_request(request_id, prompt, params, messages=messages,
                                        lora_request=lora_request,
                                        chat_template_kwargs=chat_template_kwargs)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    # ---- LoRA adapters (vLLM's names) ------------------------------------------------
    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter into the engine now (checked first: ValueError naming the problem,
        nothing loaded); False if it holds it already."""
        check_lora_request(lora_request, self.config.enable_lora)
        return await asyncio.wrap_future(self._supervisor.require_ready().call("add_lora", lora_request))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Drop an adapter's copies; False if the engine did not hold it. Requests still
        running under it go on (it is reloaded from its folder if they need it again)."""
        return await asyncio.wrap_future(self._supervisor.require_ready().call("remove_lora", lora_int_id))

    async def list_loras(self) -> list[int]:
        """The ids of the adapters the engine holds (host copies), ascending."""
        return await asyncio.wrap_future(self._supervisor.require_ready().call("list_loras"))

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
    def _abort_in_engine(self, request_id: str) -> list[RequestOutput]:
        if self._frontend is None:
            return []
        ready = self._supervisor.health.status is EngineState.READY
        return self._frontend.abort([request_id], tell_core=ready)

    def _cancel(self, request_id: str) -> None:
        """A stream was closed early: abort silently (nobody reads the stream any more)."""
        self._streams.end(request_id)
        self._abort_in_engine(request_id)

    def _finish_aborted(self, request_id: str) -> None:
        for out in self._abort_in_engine(request_id):  # each running choice's last output
            self._streams.deliver(out)
        self._streams.end(request_id)

    def _deliver(self, out: RequestOutput) -> None:
        if out.error is None:
            self._streams.deliver(out)
            return
        # One choice failed: the request fails, and its other choices stop.
        self._streams.end(out.request_id, RequestFailedError(out.error))
        self._abort_in_engine(out.request_id)

    def _notify(self, out: RequestOutput) -> None:
        for listener in self._output_listeners:
            try:
                listener(out)
            except Exception:
                logger.exception("output listener failed")

    def _on_message(self, message: object) -> None:
        match message:
            case StepOutputs(outputs, stats, iteration_tokens, num_steps, used_blocks):
                if iteration_tokens:
                    for step_listener in self._step_listeners:
                        step_listener(iteration_tokens, num_steps, used_blocks)
                if outputs and self._frontend is not None:
                    for out in self._frontend.process_outputs(outputs):
                        self._deliver(out)
                if stats is not None:
                    self.last_stats = stats
                    self._streams.publish_stats(stats)
            case RequestRejected(engine_request_id, text):
                if self._frontend is not None:
                    request_id = self._frontend.refused(engine_request_id)
                    if request_id is not None:
                        self._streams.end(request_id, ValueError(text))
            case _:
                logger.warning("unexpected message from the engine: %s", type(message).__name__)

    def _on_death(self, detail: str) -> None:
        error = EngineDeadError(detail)
        self._streams.end_all(error)
        if self._frontend is not None:
            # Their last word: finished with "error", so listeners (metrics) count them.
            self._frontend.abort(list(self._frontend.requests), tell_core=False, error=detail)
        self._streams.publish_stats(error)


def _tokenize(frontend: Frontend | None, prompt: Prompt | None, messages: list[dict] | None,
              tools: list[dict] | None, params: SamplingParams,
              template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
    """In the tokenizer's thread: the grammar check (remembered, so add_encoded finds it
    done), then the prompt's token ids."""
    if frontend is None:
        raise EngineNotReadyError("the engine has not been started")
    structured = getattr(params, "structured_outputs", None)  # a non-SamplingParams fails later
    if structured is not None:
        checked_grammar(structured)
    return frontend.encode(prompt, messages, tools, template_kwargs)


__all__ = [
    "AsyncLLM",
    "EngineDeadError",
    "EngineHealth",
    "EngineNotReadyError",
    "EngineStartError",
    "EngineState",
    "RequestFailedError",
    "RequestStream",
    "StartupProgress",
]
