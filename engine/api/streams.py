"""Per-request output streams and the stats fan-out of the async client.

A `RequestStream` is an async iterator over one request's `RequestOutput`s; it ends after
the finished output, or raises what ended it (EngineDeadError, ValueError for a request the
core refused, RequestFailedError for one that failed in the engine). Closing it early
aborts the request. Stats readers each get a small queue that keeps the newest snapshots,
so a slow reader never builds a backlog.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kvdeck.engine.types.outputs import RequestOutput

STATS_BACKLOG = 32  # snapshots kept per slow stats reader (oldest dropped first)


class RequestFailedError(RuntimeError):
    """This request failed in the engine (the engine and the other requests went on)."""


@dataclass(slots=True)
class StreamQueue:
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    has_output: bool = False


class StreamRegistry:
    """The open streams by request id, and the stats readers."""

    def __init__(self) -> None:
        self.streams: dict[str, StreamQueue] = {}
        self.stats_readers: set[asyncio.Queue] = set()

    def open(self, request_id: str) -> StreamQueue:
        if request_id in self.streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        stream = self.streams[request_id] = StreamQueue()
        return stream

    def deliver(self, output: RequestOutput) -> None:
        stream = self.streams.get(output.request_id)
        if stream is None:
            return
        stream.has_output = True
        if output.error is not None:
            self.end(output.request_id, RequestFailedError(output.error))
            return
        stream.queue.put_nowait(output)
        if output.finished:
            del self.streams[output.request_id]

    def end(self, request_id: str, item: RequestOutput | BaseException | None = None) -> None:
        """Close one stream, with a last output or the error that ended it."""
        stream = self.streams.pop(request_id, None)
        if stream is not None and item is not None:
            stream.queue.put_nowait(item)

    def end_all(self, error: BaseException) -> list[str]:
        """Every stream raises `error`; the ids that were open."""
        ids = list(self.streams)
        for stream in self.streams.values():
            stream.queue.put_nowait(error)
        self.streams.clear()
        return ids

    @property
    def num_waiting(self) -> int:
        return sum(1 for s in self.streams.values() if not s.has_output)

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

    def __init__(self, request_id: str, stream: StreamQueue, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._stream = stream
        self._abort = abort
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
            self._abort(self.request_id)

    async def aclose(self) -> None:
        self.cancel()  # the caller stopped listening (cancelled, closed, broke out)
