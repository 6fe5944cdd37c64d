"""The TUI's engine client for a server it is attached to (`kvdeck attach URL`).

It has the local client's shape (start, generate, encode, abort, stats_stream, health,
restart, shutdown), so the chat pane and the dashboard do not know which they talk to:
chat goes through the server's OpenAI API, the dashboard's snapshots come from kvdeck's
stats stream (GET /kvdeck/v1/stats). A server that is not kvdeck (vLLM, or anything
exporting vLLM's metric names) has no stats stream: `kind` is "openai" and the dashboard
reads `metrics_stream()`, summaries of /metrics, instead.

A server that goes away never blocks the UI: reads have timeouts, `health()` turns "dead"
with the reason and the next retry, the streams reconnect by themselves with backoff and
keep the last figures (`last_stats`, `last_metrics`) for the dashboard to grey out.
"""

import asyncio
import json
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from kvdeck.app.attach.connection import (
    Backoff,
    RemoteAuthError,
    RemoteHealth,
    RemoteProgress,
    normalise_url,
    refused,
    transport_reason,
)
from kvdeck.app.attach.metrics_view import MetricsView, summarise
from kvdeck.app.attach.openai_reply import UNKNOWN_TOKEN_ID, ReplyAccumulator, request_body
from kvdeck.app.attach.prometheus import Scrape, parse
from kvdeck.app.attach.sse import server_sent_events
from kvdeck.engine.api.async_llm import EngineDeadError, EngineStartError, RequestFailedError
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import (
    EngineStats,
    RequestStats,
    request_stats_from_dict,
    stats_from_dict,
)

CONNECT_TIMEOUT_S = 5.0
STATS_STALL_S = 5.0  # the stats stream sends an event at least once a second: silence is a stall
REQUEST_TIMEOUT_S = 10.0  # models, info, tokenize, metrics
REPLY_STALL_S = 300.0  # between two chunks of a reply (a long prompt's prefill on a busy server)
METRICS_INTERVAL_S = 1.0
METRICS_HISTORY = 300  # scrapes kept (5 minutes at one a second; the view's window is 30 s)
LATENCY_BACKLOG = 4096
TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators, when the server cannot count
ENCODE_CACHE = 256  # prompts kept tokenised: fitting a chat to the context re-asks often
SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog while seven wizards quietly brew "
               "hot coffee; meanwhile, an old engine counts blocks, pages, tokens and numbers "
               "like 2048 or 31, then writes short reports about memory, caches and time.")
_ABORTED, _DONE = object(), object()


@dataclass(slots=True)
class RemoteTokenizer:
    """What the TUI reads of a tokenizer it cannot load: the vocabulary size, if told."""

    vocab_size: int | None = None
    chat_template: str | None = None  # applied by the server


class RemoteClient:
    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = normalise_url(url)
        self.api_key = api_key
        self.kind = "unknown"  # "kvdeck" (stats stream) | "openai" (metrics only)
        self.engine_label = "server"  # what the title calls it: "kvdeck", "vLLM", "server"
        self.model_name = ""
        self.max_model_len = 0
        self.num_blocks = 0
        self.block_size = 0
        self.model_dir = None  # the model's files are on the server
        self.tokenizer = RemoteTokenizer()
        self.info: dict = {}
        self.has_metrics = False
        self.token_pool: list[int] = []  # valid ids for synthetic load when the vocabulary is unknown
        self.last_stats: EngineStats | None = None
        self.last_metrics: MetricsView | None = None
        self.latencies: deque[tuple[str, float, float]] = deque(maxlen=LATENCY_BACKLOG)
        self.ended: deque[RequestStats] = deque(maxlen=LATENCY_BACKLOG)  # finished requests
        self._health = RemoteHealth("starting", f"connecting to {self.url}")
        self._replies: dict[str, asyncio.Task] = {}
        self._encoded: OrderedDict[str, list[int]] = OrderedDict()
        self._stats_streaming = False  # while it runs, the stats stream decides the health
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)
        self._sync_http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    # ---- lifecycle ------------------------------------------------------------------------
    async def start(self, on_progress: Callable[[RemoteProgress], None] | None = None) -> None:
        """Find out what the server is; raises RemoteAuthError for a refused key and
        EngineStartError for a server that cannot be reached or is not OpenAI-compatible."""
        report = on_progress or (lambda progress: None)
        report(RemoteProgress("starting", f"connecting to {self.url}"))
        try:
            models = await self._get_json("/v1/models")
            report(RemoteProgress("loading", f"asking {self.url} what it runs"))
            info = await self._http.get("/kvdeck/v1/info")
            metrics = await self._http.get("/metrics")
        except httpx.TransportError as exc:
            self._health = RemoteHealth("dead", f"{transport_reason(exc)}: {self.url}")
            raise EngineStartError(f"cannot reach {self.url}: {transport_reason(exc)}") from None
        cards = models.get("data") or []
        if not cards:
            raise EngineStartError(f"{self.url}/v1/models lists no model")
        self.model_name = str(cards[0].get("id", ""))
        self.max_model_len = int(cards[0].get("max_model_len") or 0)
        self.has_metrics = metrics.status_code == 200
        if info.status_code == 200:
            self.kind, self.engine_label = "kvdeck", "kvdeck"
            self._apply_info(info.json())
        elif info.status_code in (401, 403):
            raise refused(info, self.url)
        else:
            self.kind = "openai"
            self.engine_label = "vLLM" if self.has_metrics and "vllm:" in metrics.text else "server"
            self.token_pool = await self._sample_token_ids()
        self._health = RemoteHealth("ready", f"attached to {self.engine_label} at {self.url}")
        report(RemoteProgress("ready", self._health.detail))

    async def _sample_token_ids(self) -> list[int]:
        """Ids the server's tokenizer really produces (from /tokenize of a sample text): a
        server that does not say its vocabulary size still gets valid synthetic prompts."""
        try:
            response = await self._http.post("/tokenize", json={"model": self.model_name,
                                                                 "prompt": SAMPLE_TEXT})
            if response.status_code == 200:
                return sorted({int(t) for t in response.json()["tokens"]})
        except (httpx.TransportError, ValueError, KeyError, TypeError):
            pass
        return []

    async def restart(self) -> None:
        """Nothing to restart on a remote server: reconnect and re-read what it runs."""
        await self.start()

    async def shutdown(self) -> None:
        for task in list(self._replies.values()):
            task.cancel()
        self._health = RemoteHealth("stopped", f"detached from {self.url}")
        await self._http.aclose()
        self._sync_http.close()

    def health(self) -> RemoteHealth:
        return self._health

    # ---- requests -------------------------------------------------------------------------
    async def generate(self, prompt: str | list[int] | None, params: SamplingParams,
                       request_id: str | None = None,
                       messages: list[dict] | None = None,
                       chat_template_kwargs: dict | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs as the server streams them; closing the iterator or abort()
        closes the connection, which aborts the request on the server."""
        request_id = request_id or f"attach-{uuid.uuid4().hex[:12]}"
        path, body = request_body(self.model_name, params, prompt, messages)
        if chat_template_kwargs is not None and messages is not None:  # vLLM's field too
            body["chat_template_kwargs"] = chat_template_kwargs
        reply = ReplyAccumulator.start(request_id, prompt if isinstance(prompt, str) else None)
        chunks: asyncio.Queue = asyncio.Queue()
        pump = asyncio.ensure_future(self._pump_reply(path, body, chunks))
        pump.add_done_callback(lambda task: chunks.put_nowait(
            _ABORTED if task.cancelled() else task.exception() or _DONE))
        self._replies[request_id] = pump
        try:
            while (item := await chunks.get()) is not _DONE:
                if item is _ABORTED:
                    reply.finish_reason = "abort"
                    break
                if isinstance(item, BaseException):
                    raise item
                if (out := reply.add_chunk(item)) is not None:
                    yield out
            yield reply.finish()
        finally:
            self._replies.pop(request_id, None)
            pump.cancel()

    async def abort(self, request_id: str) -> None:
        task = self._replies.get(request_id)
        if task is not None:
            task.cancel()

    async def _pump_reply(self, path: str, body: dict, chunks: asyncio.Queue) -> None:
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S, read=REPLY_STALL_S)
        try:
            async with self._http.stream("POST", path, json=body, timeout=timeout) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise refused(response, self.url)
                async for event in server_sent_events(response):
                    if event.data == "[DONE]":
                        return
                    chunk = json.loads(event.data)
                    if "error" in chunk or chunk.get("object") == "error":
                        raise _stream_error(chunk.get("error", chunk))
                    chunks.put_nowait(chunk)
        except httpx.TransportError as exc:
            self._lost(exc)
            raise EngineDeadError(f"lost {self.url}: {transport_reason(exc)}") from None

    def encode(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        """Token ids as the server counts them (POST /tokenize, cached). Blocking: the TUI
        calls it from a worker thread."""
        if isinstance(prompt, list):
            return None, list(prompt)
        body, key = self._tokenize_body(prompt, messages, chat_template_kwargs)
        if key not in self._encoded:
            try:
                response = self._sync_http.post("/tokenize", json=body)
            except httpx.TransportError as exc:
                raise EngineDeadError(f"cannot tokenize on {self.url}: "
                                      f"{transport_reason(exc)}") from None
            self._remember(key, self._tokens(response, body))
        return (prompt if isinstance(prompt, str) else None), list(self._encoded[key])

    async def encode_async(self, prompt: str | list[int] | None = None,
                           messages: list[dict] | None = None,
                           chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        if isinstance(prompt, list):
            return None, list(prompt)
        body, key = self._tokenize_body(prompt, messages, chat_template_kwargs)
        if key not in self._encoded:
            try:
                response = await self._http.post("/tokenize", json=body)
            except httpx.TransportError as exc:
                raise EngineDeadError(f"cannot tokenize on {self.url}: "
                                      f"{transport_reason(exc)}") from None
            self._remember(key, self._tokens(response, body))
        return (prompt if isinstance(prompt, str) else None), list(self._encoded[key])

    def _tokenize_body(self, prompt: str | None, messages: list[dict] | None,
                       chat_template_kwargs: dict | None = None) -> tuple[dict, str]:
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt or messages")
        body = ({"model": self.model_name, "prompt": prompt} if messages is None else
                {"model": self.model_name, "messages": messages, "add_generation_prompt": True})
        if chat_template_kwargs is not None and messages is not None:
            body["chat_template_kwargs"] = chat_template_kwargs
        return body, json.dumps(body, sort_keys=True)

    def _tokens(self, response: httpx.Response, body: dict) -> list[int]:
        if response.status_code in (404, 405):  # no /tokenize (Ollama, some proxies)
            return [UNKNOWN_TOKEN_ID] * estimated_tokens(body)
        if response.status_code != 200:
            raise refused(response, self.url)
        return [int(t) for t in response.json()["tokens"]]

    def _remember(self, key: str, ids: list[int]) -> None:
        self._encoded[key] = ids
        while len(self._encoded) > ENCODE_CACHE:
            self._encoded.popitem(last=False)

    # ---- the dashboard's feeds ----------------------------------------------------------
    async def stats_stream(self) -> AsyncIterator[EngineStats]:
        """kvdeck servers: the engine's snapshots, for ever (reconnecting with backoff);
        TTFT/ITL samples land in `latencies`. Other servers have none: see metrics_stream."""
        if self.kind != "kvdeck":
            return
        self._stats_streaming = True
        try:
            async for stats in self._stats_events():
                yield stats
        finally:
            self._stats_streaming = False

    async def _stats_events(self) -> AsyncIterator[EngineStats]:
        backoff = Backoff()
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S, read=STATS_STALL_S)
        while self._health.status != "stopped":
            try:
                async with self._http.stream("GET", "/kvdeck/v1/stats", timeout=timeout) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise refused(response, self.url)
                    async for event in server_sent_events(response):
                        backoff.reset()
                        stats = self._on_stats_event(event.event, json.loads(event.data))
                        if stats is not None:
                            yield stats
                raise httpx.RemoteProtocolError("the stats stream ended")
            except RemoteAuthError as exc:
                self._health = RemoteHealth("dead", str(exc))
                raise
            except (httpx.TransportError, EngineDeadError, RequestFailedError, ValueError) as exc:
                await self._wait_to_retry(backoff, exc)  # ValueError: a malformed event

    def _on_stats_event(self, kind: str, data: dict) -> EngineStats | None:
        if kind == "info":
            self._apply_info(data)
        elif kind == "health":  # the server is up, its engine is not (restarting)
            self._health = RemoteHealth("starting", f"the engine on {self.url} is "
                                                    f"{data.get('status')}: {data.get('detail')}")
        elif kind == "stats":
            self._health = RemoteHealth("ready", f"attached to kvdeck at {self.url}")
            self.latencies.extend(tuple(sample) for sample in data.get("latencies", []))
            self.ended.extend(request_stats_from_dict(entry) for entry in data.get("ended", []))
            self.last_stats = stats_from_dict(data["stats"])
            return self.last_stats
        return None

    async def metrics_stream(self, interval_s: float = METRICS_INTERVAL_S) -> AsyncIterator[MetricsView]:
        """Any server with Prometheus /metrics in vLLM's names: a summary per scrape
        (gauges, rates and percentiles over the recent window), reconnecting with backoff."""
        if not self.has_metrics:
            return
        history: deque[Scrape] = deque(maxlen=METRICS_HISTORY)
        backoff = Backoff()
        while self._health.status != "stopped":
            try:
                response = await self._http.get("/metrics")
                if response.status_code != 200:
                    raise refused(response, self.url)
                history.append(parse(response.text, time.time()))
                backoff.reset()
                if not self._stats_streaming:
                    self._health = RemoteHealth("ready", f"attached to {self.engine_label} "
                                                         f"at {self.url}")
                self.last_metrics = summarise(history)
                yield self.last_metrics
                await asyncio.sleep(interval_s)
            except RemoteAuthError as exc:
                self._health = RemoteHealth("dead", str(exc))
                raise
            except (httpx.TransportError, EngineDeadError, RequestFailedError, ValueError) as exc:
                await self._wait_to_retry(backoff, exc)  # ValueError: a malformed event

    def drain_latencies(self) -> list[tuple[str, float, float]]:
        """(kind "ttft" | "itl", timestamp, seconds) received since the last call."""
        samples = list(self.latencies)
        self.latencies.clear()
        return samples

    def drain_ended(self) -> list[RequestStats]:
        """Final figures of the requests that finished since the last call (a kvdeck server's
        stats events carry them)."""
        ended = list(self.ended)
        self.ended.clear()
        return ended

    # ---- helpers -------------------------------------------------------------------------
    async def _wait_to_retry(self, backoff: Backoff, exc: BaseException) -> None:
        delay = backoff.next_delay()
        reason = transport_reason(exc) if isinstance(exc, httpx.TransportError) else str(exc)
        self._health = RemoteHealth("dead", f"disconnected from {self.url} ({reason}); "
                                            f"retrying in {delay:.1f} s")
        await asyncio.sleep(delay)

    def _lost(self, exc: BaseException) -> None:
        if self._health.status != "stopped":
            self._health = RemoteHealth("dead", f"disconnected from {self.url} "
                                                f"({transport_reason(exc)})")

    def _apply_info(self, info: dict) -> None:
        self.info = info
        self.num_blocks = int(info.get("num_blocks") or self.num_blocks)
        self.block_size = int(info.get("block_size") or self.block_size)
        self.max_model_len = int(info.get("max_model_len") or self.max_model_len)
        if info.get("vocab_size"):
            self.tokenizer.vocab_size = int(info["vocab_size"])

    async def _get_json(self, path: str) -> dict:
        response = await self._http.get(path)
        if response.status_code != 200:
            error = refused(response, self.url)
            if isinstance(error, RemoteAuthError):
                raise error
            raise EngineStartError(f"{self.url}{path} answered {response.status_code}: {error}")
        return response.json()


def estimated_tokens(body: dict) -> int:
    """An upper bound for a server that cannot count: a byte-level BPE token covers at least
    one UTF-8 byte, and a chat template adds a few tokens around each message."""
    if body.get("messages") is None:
        return len(str(body.get("prompt", "")).encode())
    return sum(len(str(m.get("content") or "").encode()) + TEMPLATE_TOKENS_PER_MESSAGE
               for m in body["messages"]) + TEMPLATE_TOKENS_PER_MESSAGE


def _stream_error(error: dict) -> Exception:
    message = str(error.get("message") or error)
    if error.get("code") in ("engine_unavailable", "server_shutting_down"):
        return EngineDeadError(message)
    return RequestFailedError(message)
