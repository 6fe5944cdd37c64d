"""Running engine requests for an HTTP request: SSE responses that abort on disconnect,
waiting for the final outputs, merging the streams of several prompts, and the error a
failed run gets."""

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.shutdown import Drain
from kvdeck.engine.api.async_llm import (
    EngineDeadError,
    EngineNotReadyError,
    RequestFailedError,
    RequestStream,
)
from kvdeck.engine.types.outputs import RequestOutput

ENGINE_START_RETRY_S = 5.0  # Retry-After while the engine is starting


class ServerShuttingDown(Exception):
    """The grace period after SIGTERM ran out with this request still running."""



class EventStreamResponse(StreamingResponse):
    """SSE response (or another streamed media type: Ollama's NDJSON) that always closes its
    generator, so a disconnect aborts the request."""

    def __init__(self, content: AsyncIterator[str], streams: list[RequestStream],
                 media_type: str = "text/event-stream") -> None:
        super().__init__(content, media_type=media_type,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._source = content
        self._streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()
            for stream in self._streams:  # also when the body never started
                stream.cancel()



async def run_to_end(streams: list[RequestStream], raw: Request,
                     drain: Drain) -> list[list[RequestOutput]]:
    """Each stream's final outputs (one per choice); if the HTTP client goes away first,
    abort (frees the blocks)."""
    work = asyncio.ensure_future(asyncio.gather(*(s.final_outputs() for s in streams)))
    watchers = {asyncio.ensure_future(wait_disconnect(raw)), asyncio.ensure_future(drain.expired.wait())}
    try:
        await asyncio.wait({work, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
        finished = work.done()
        if not finished:
            work.cancel()
        for stream in streams:
            stream.cancel()
    if not finished:
        if drain.expired.is_set():
            raise stream_error(ServerShuttingDown())
        raise OpenAIError(400, "the client disconnected", code="client_disconnected")
    try:
        return work.result()
    except Exception as exc:
        raise stream_error(exc) from None



def stream_error(exc: Exception) -> OpenAIError:
    """What a request that failed while running is told."""
    match exc:
        case EngineDeadError() | EngineNotReadyError():
            return OpenAIError(503, f"the engine stopped: {exc}", code="engine_unavailable",
                               retry_after=ENGINE_START_RETRY_S)
        case RequestFailedError():
            return OpenAIError(500, f"the engine could not complete this request: {exc}",
                               code="request_failed")
        case ServerShuttingDown():
            return OpenAIError(503, "the server is shutting down", code="server_shutting_down")
        case OpenAIError():
            return exc
        case ValueError():
            return OpenAIError(400, str(exc))
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}")



async def wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass



async def merged_outputs(streams: list[RequestStream],
                         drain: Drain) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from the streams of one or several prompts, as they arrive;
    raises ServerShuttingDown once the grace period after SIGTERM is over."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:
            queue.put_nowait(exc)

    async def cut() -> None:
        await drain.expired.wait()
        queue.put_nowait(ServerShuttingDown())

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    tasks.append(asyncio.ensure_future(cut()))
    remaining = len(streams)
    try:
        while remaining:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item[1].finished:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
