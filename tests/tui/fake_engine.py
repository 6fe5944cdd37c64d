"""A deterministic stand-in for engine.api.async_llm.AsyncLLM, for the TUI's tests.

It simulates a paged KV pool (block allocation on demand, prefix sharing by block hash
once a block is computed, cached-evictable blocks after a request ends, abort freeing at
once) and streams canned
tokens, so the dashboard shows real-looking, checkable state without torch or a model.
`frozen_stats` replaces the live stats with a fixed list, for snapshot pictures.
"""

from __future__ import annotations

import asyncio
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.engine.frontend.chat import render_chat
from kvdeck.engine.frontend.tokenizer import encode_prompt, load_tokenizer
from kvdeck.engine.types.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats, RequestStats

REPLY = (
    "Paged attention stores the **KV cache** in fixed-size blocks.\n\n"
    "- each request has a *block table*\n- blocks are shared by prefix\n\n"
    "That is how the engine batches many requests at once."
)


class FakeEngineDead(RuntimeError):
    pass


@dataclass(slots=True)
class FakeProgress:
    stage: str
    message: str


@dataclass(slots=True)
class FakeHealth:
    status: str
    detail: str = ""


@dataclass(slots=True)
class FakeTokenizer:
    vocab_size: int = 1000


@dataclass(slots=True)
class FakeRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    state: str = "waiting"
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    unregistered: list[tuple[int, int]] = field(default_factory=list)  # (hash, block) to cache
    aborted: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set on abort: stop waiting

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


def text_to_ids(text: str, vocab_size: int) -> list[int]:
    return [3 + zlib.crc32(word.encode()) % (vocab_size - 3) for word in text.split()]


class FakeEngineClient:
    def __init__(self, *, num_blocks: int = 256, block_size: int = 16, reply: str = REPLY,
                 token_delay: float = 0.02, stats_interval: float = 0.05,
                 frozen_stats: list[EngineStats] | None = None, fail_start: str | None = None,
                 max_model_len: int = 4096, startup_delay: float = 0.0,
                 model_name: str = "fake-llama", reject: str | None = None,
                 model_dir: Path | None = None, real_tokenizer: bool = False) -> None:
        self.model_name = model_name
        self.model_dir = model_dir
        self.max_model_len = max_model_len
        # real_tokenizer: the model_dir's own tokenizer and chat template count the tokens
        # (what the real client does), so context limits are hit where the engine hits them.
        self.tokenizer = load_tokenizer(model_dir) if real_tokenizer and model_dir else FakeTokenizer()
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reply_pieces = re.findall(r"\S+\s*|\n+", reply)
        self.token_delay = token_delay
        self.stats_interval = stats_interval
        self.frozen_stats = frozen_stats
        self.fail_start = fail_start
        self.startup_delay = startup_delay
        self.status = "stopped"
        self.requests: dict[str, FakeRequest] = {}
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.written: set[int] = set()
        self.counters = dict(queries=0, hits=0, prompt=0, generated=0, finished=0, steps=0)
        self.last_prefill = 0
        self.last_decode = 0
        self.aborted_ids: list[str] = []
        self.last_messages: list[dict] | None = None
        self.last_template_kwargs: dict | None = None
        self.last_params: SamplingParams | None = None
        self.sent: list[tuple[int, int]] = []  # (prompt tokens, max_tokens) of each request
        self.prompts: list[list[int]] = []  # the prompt ids of each request
        self.reject = reject  # every request fails with ValueError(reject), as a core refusal
        self.started_count = 0
        self.shutdown_count = 0
        self.output_listeners: list[Callable[[RequestOutput], None]] = []
        self._next_id = 0

    # ----- lifecycle --------------------------------------------------------------------
    async def start(self, on_progress: Callable[[FakeProgress], None] | None = None) -> None:
        self.status = "starting"
        self.started_count += 1
        for stage, message in (("starting", "spawning the engine process"),
                               ("loading", "loading weights"), ("profiling", "sizing the KV pool")):
            if on_progress:
                on_progress(FakeProgress(stage, message))
            await asyncio.sleep(self.startup_delay)
        if self.fail_start:
            self.status = "dead"
            raise RuntimeError(self.fail_start)
        self.status = "ready"
        if on_progress:
            on_progress(FakeProgress("ready", f"{self.num_blocks} KV blocks"))

    def health(self) -> FakeHealth:
        return FakeHealth(self.status, "engine process exited (fake crash)"
                          if self.status == "dead" else "")

    def crash(self) -> None:
        self.status = "dead"

    async def restart(self) -> None:
        await self.start()

    async def shutdown(self) -> None:
        self.shutdown_count += 1
        self.status = "stopped"

    # ----- requests ---------------------------------------------------------------------
    async def abort(self, request_id: str) -> None:
        self.aborted_ids.append(request_id)
        request = self.requests.get(request_id)
        if request is not None:
            request.aborted = True
            request.wake.set()
            self._free(request)

    async def generate(self, prompt: str | list[int] | None, params: SamplingParams,
                       request_id: str | None = None,
                       messages: list[dict] | None = None,
                       chat_template_kwargs: dict | None = None) -> AsyncIterator[RequestOutput]:
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        if self.status != "ready":
            raise FakeEngineDead(f"engine is {self.status}")
        self.last_messages = messages
        self.last_params = params
        self.last_template_kwargs = chat_template_kwargs
        _, prompt_ids = self.encode(prompt, messages, chat_template_kwargs)
        self.check_request(prompt_ids, params)  # as the real client: before anything is queued
        self.sent.append((len(prompt_ids), params.max_tokens))
        self.prompts.append(prompt_ids)
        if self.reject:
            raise ValueError(self.reject)
        if request_id is None:
            self._next_id += 1
            request_id = f"req-{self._next_id}"
        request = FakeRequest(request_id, prompt_ids, params.max_tokens or 16, params.ignore_eos)
        self.requests[request_id] = request
        metrics = RequestMetrics(arrival_time=time.time())
        text = ""
        try:
            while not self._allocate_prompt(request):
                if request.aborted:
                    break
                await self._pause(request)
            request.state = "prefilling"
            await self._pause(request)
            self._register_prefix(request)
            self.last_prefill = len(prompt_ids)
            reason = None
            while reason is None:
                if self.status != "ready":
                    raise FakeEngineDead("engine process died")
                if request.aborted:
                    reason = "abort"
                    break
                step = len(request.output_ids)
                piece = (self.reply_pieces[step] if step < len(self.reply_pieces)
                         else "tok ")
                request.output_ids.append(7 + step % 50)
                self._grow(request)
                request.state = "decoding"
                self.counters["generated"] += 1
                self.counters["steps"] += 1
                self.last_decode = sum(r.state == "decoding" for r in self.requests.values())
                text += piece
                now = time.time()
                metrics.first_token_time = metrics.first_token_time or now
                metrics.last_token_time = now
                if len(request.output_ids) >= request.max_tokens:
                    reason = "length"
                elif step + 1 >= len(self.reply_pieces) and not request.ignore_eos:
                    reason = "stop"
                if reason is None:
                    yield self._output(request, text, piece, None, metrics)
                    await self._pause(request)
                else:
                    break
            if reason != "abort":
                self.counters["finished"] += 1
            metrics.finished_time = time.time()
            self._free(request)
            yield self._output(request, text, piece if reason != "abort" else "", reason,
                               metrics)
        finally:
            self._free(request)

    def encode(self, prompt: str | list[int] | None = None,
               messages: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        """One id per word (of each message's role and content), like a tokenizer would;
        with a real tokenizer, what the real client sends."""
        if not isinstance(self.tokenizer, FakeTokenizer):
            if messages is not None:
                return None, render_chat(self.tokenizer, messages, template_kwargs=chat_template_kwargs)
            return encode_prompt(self.tokenizer, prompt)
        if messages is not None:
            text = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
            return None, text_to_ids(text, self.tokenizer.vocab_size)
        if isinstance(prompt, str):
            return prompt, text_to_ids(prompt, self.tokenizer.vocab_size)
        if isinstance(prompt, list):
            return None, list(prompt)
        raise ValueError("prompt or messages is required")

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """The real client's admission check (RequestLimits), with its message."""
        vocab = (self.tokenizer.vocab_size if isinstance(self.tokenizer, FakeTokenizer)
                 else len(self.tokenizer))
        RequestLimits(self.max_model_len, vocab).check(prompt_ids, params)

    async def _pause(self, request: FakeRequest) -> None:
        """One simulated step; an abort ends the wait at once."""
        if self.token_delay <= 0:
            await asyncio.sleep(0)
            return
        try:
            await asyncio.wait_for(request.wake.wait(), self.token_delay)
        except TimeoutError:
            pass

    def add_output_listener(self, listener: Callable[[RequestOutput], None]) -> None:
        self.output_listeners.append(listener)  # as AsyncLLM's: every request's outputs

    def _output(self, request: FakeRequest, text: str, delta: str, reason: str | None,
                metrics: RequestMetrics) -> RequestOutput:
        completion = CompletionOutput(0, text, list(request.output_ids), reason)
        output = RequestOutput(request.request_id, None, request.prompt_ids, [completion],
                               reason is not None, metrics, delta_text=delta,
                               delta_token_ids=request.output_ids[-1:] if delta else [],
                               num_cached_tokens=request.num_cached_tokens)
        for listener in self.output_listeners:
            listener(output)
        return output

    # ----- the simulated block pool -----------------------------------------------------
    def _take_block(self) -> int | None:
        free = [b for b in range(self.num_blocks) if self.ref_counts[b] == 0]
        if not free:
            return None
        uncached = [b for b in free if self.block_hash[b] is None]
        block = uncached[0] if uncached else free[0]
        old = self.block_hash[block]
        if old is not None:  # evict the cached prefix it held
            self.hash_to_block.pop(old, None)
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def _allocate_prompt(self, request: FakeRequest) -> bool:
        needed = -(-len(request.prompt_ids) // self.block_size)
        free = sum(1 for r in self.ref_counts if r == 0)
        if needed > free:
            return False
        self.counters["queries"] += len(request.prompt_ids)
        self.counters["prompt"] += len(request.prompt_ids)
        self.written = set()
        sharing = True
        for i in range(needed):
            end = (i + 1) * self.block_size
            full = end <= len(request.prompt_ids)
            h = zlib.crc32(repr(request.prompt_ids[:end]).encode()) if full else None
            hit = self.hash_to_block.get(h) if (sharing and h is not None) else None
            if hit is not None:
                self.ref_counts[hit] += 1
                request.blocks.append(hit)
                request.num_cached_tokens += self.block_size
                self.counters["hits"] += self.block_size
                continue
            sharing = False
            block = self._take_block()
            assert block is not None
            if h is not None:
                request.unregistered.append((h, block))
            request.blocks.append(block)
            self.written.add(block)
        return True

    def _register_prefix(self, request: FakeRequest) -> None:
        """As the real engine: a full block joins the prefix cache once it is computed, so
        requests admitted together share nothing."""
        for h, block in request.unregistered:
            if h not in self.hash_to_block and self.ref_counts[block] > 0:
                self.block_hash[block] = h
                self.hash_to_block[h] = block
        request.unregistered = []

    def _grow(self, request: FakeRequest) -> None:
        if request.num_tokens > len(request.blocks) * self.block_size:
            block = self._take_block()
            if block is None:
                raise FakeEngineDead("fake pool exhausted during decode")
            request.blocks.append(block)
        self.written = {request.blocks[-1]} if request.blocks else set()

    def _free(self, request: FakeRequest) -> None:
        if self.requests.pop(request.request_id, None) is None:
            return
        for block in request.blocks:
            self.ref_counts[block] = max(0, self.ref_counts[block] - 1)
        request.blocks = []

    # ----- statistics -------------------------------------------------------------------
    def snapshot(self, timestamp: float | None = None) -> EngineStats:
        requests = [
            RequestStats(r.request_id, r.state, len(r.prompt_ids),
                         len(r.prompt_ids) if r.state != "waiting" else 0, len(r.output_ids),
                         list(r.blocks), r.num_cached_tokens)
            for r in self.requests.values()
        ]
        refs = list(self.ref_counts)
        cached = [h is not None for h in self.block_hash]
        free = sum(1 for r in refs if r == 0)
        cached_free = sum(1 for r, c in zip(refs, cached, strict=True) if r == 0 and c)
        return EngineStats(
            timestamp=time.time() if timestamp is None else timestamp,
            num_running=sum(r.state != "waiting" for r in self.requests.values()),
            num_waiting=sum(r.state == "waiting" for r in self.requests.values()),
            num_preempted=0, kv_cache_usage=1 - free / self.num_blocks,
            num_blocks=self.num_blocks, block_size=self.block_size, num_free_blocks=free,
            num_cached_blocks=cached_free, block_ref_counts=refs, block_is_cached=cached,
            blocks_written_last_step=sorted(self.written), requests=requests,
            prefix_cache_queries=self.counters["queries"], prefix_cache_hits=self.counters["hits"],
            num_preemptions=0, prompt_tokens_total=self.counters["prompt"],
            generation_tokens_total=self.counters["generated"],
            num_requests_finished=self.counters["finished"], num_steps=self.counters["steps"],
            last_step_prefill_tokens=self.last_prefill, last_step_decode_tokens=self.last_decode,
            last_step_num_seqs=len(self.requests), last_step_duration_s=self.token_delay,
        )

    async def stats_stream(self) -> AsyncIterator[EngineStats]:
        if self.frozen_stats is not None:
            for stats in self.frozen_stats:
                yield stats
            await asyncio.Event().wait()  # a live stream that has nothing new to say
        while True:
            if self.status == "dead":
                raise FakeEngineDead("engine process died")
            if self.status != "ready":
                return
            yield self.snapshot()
            await asyncio.sleep(self.stats_interval)
