"""Per-request output streams and the stats fan-out of the async engine.

A `RequestStream` is an async iterator over one request's `RequestOutput`s, one per choice
that moved (`outputs[0].index` says which); it ends after the request's finished output,
or raises what ended it (EngineDeadError, ValueError for a request the core refused,
RequestFailedError for one that failed in the engine). Closing it early aborts the request,
every choice of it. Stats readers each get a small queue that keeps the newest snapshots,
so a slow reader never builds a backlog.
"""

import asyncio
from collections.abc import AsyncIterator, Callable

from kvdeck.engine.types.outputs import RequestOutput

STATS_BACKLOG = 32  # snapshots kept per slow stats reader (oldest dropped first)


class RequestFailedError(RuntimeError):
    """This request failed in the engine (the engine and the other requests went on)."""


class StreamRegistry:
    """The open streams by request id, and the stats readers."""

    def __init__(self) -> None:
        self.streams: dict[str, asyncio.Queue] = {}
        self.stats_readers: set[asyncio.Queue] = set()

    def open(self, request_id: str) -> asyncio.Queue:
        """A stream for a request the front-end has just taken (so its id is not in use)."""
        queue = self.streams[request_id] = asyncio.Queue()
        return queue

    def deliver(self, output: RequestOutput) -> None:
        queue = self.streams.get(output.request_id)
        if queue is None:
            return
        queue.put_nowait(output)
        if output.finished:
            del self.streams[output.request_id]

    def end(self, request_id: str, item: RequestOutput | BaseException | None = None) -> None:
        """Close one stream, with a last output or the error that ended it."""
        queue = self.streams.pop(request_id, None)
        if queue is not None and item is not None:
            queue.put_nowait(item)

    def end_all(self, error: BaseException) -> list[str]:
        """Every stream raises `error`; the ids that were open."""
        ids = list(self.streams)
        for queue in self.streams.values():
            queue.put_nowait(error)
        self.streams.clear()
        return ids

    def publish_stats(self, item: object) -> None:
        """A snapshot, an error or None (the end) for every stats reader."""
        for reader in self.stats_readers:
            if reader.full():
                reader.get_nowait()  # a slow reader sees the newest snapshots
            reader.put_nowait(item)

    async def read_stats(self, first: object | None) -> AsyncIterator:
        reader: asyncio.Queue = asyncio.Queue(maxsize=STATS_BACKLOG)
        self.stats_readers.add(reader)
        try:
            if first is not None:
                yield first
            while True:
                item = await reader.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stats_readers.discard(reader)


class RequestStream:
    """The outputs of one queued request, as an async iterator."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], queue: asyncio.Queue,
                 abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self._queue = queue
        self._abort = abort
        self._done = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    async def final_outputs(self) -> list[RequestOutput]:
        """Run to the end: each choice's final output, in choice order."""
        finals: dict[int, RequestOutput] = {}
        try:
            async for out in self:
                if out.outputs[0].finish_reason is not None:
                    finals[out.outputs[0].index] = out
        finally:
            self.cancel()
        return [finals[index] for index in sorted(finals)]

    def cancel(self) -> None:
        """Abort the request unless it already ended (idempotent)."""
        if not self._done:
            self._done = True
            self._abort(self.request_id)

    async def aclose(self) -> None:
        self.cancel()  # the caller stopped listening (cancelled, closed, broke out)
