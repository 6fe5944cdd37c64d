"""The request body limit: 413 before anything parses a body that is too large.

A body with a Content-Length is judged by its header, before a byte of it is read; a
chunked body is counted as it arrives and refused once it passes the limit. Either way
the app never sees it, so one oversized request cannot hold the event loop parsing it.
The rest of a refused body is read and dropped (up to a few times the limit) before the
answer, so the client can read the 413 instead of a reset connection.
"""

from kvdeck.app.serve.errors import OpenAIError, error_response

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: ~1M tokens of text, beyond any context length
DRAIN_FACTOR = 8  # a refused body is drained up to this many times the limit, then cut off


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await error_response(OpenAIError(400, "the Content-Length header is not a number"),
                                     path=scope["path"])(scope, receive, send)
            elif int(length) > self.max_bytes:
                await _drain(receive, 0, DRAIN_FACTOR * self.max_bytes)
                await self._too_large(int(length), scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        # No length given (chunked transfer): read it here, up to the limit, then replay it.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message, receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive, size, DRAIN_FACTOR * self.max_bytes)
                await self._too_large(size, scope, receive, send, at_least=True)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        await self.app(scope, _replay(chunks, None, receive), send)

    async def _too_large(self, size: int, scope, receive, send, at_least: bool = False) -> None:
        error = OpenAIError(413, f"the request body is {'more than ' if at_least else ''}{size} bytes; "
                                 f"this server takes at most {self.max_bytes} (--max-request-body-mb)",
                            code="request_too_large")
        await error_response(error, path=scope["path"])(scope, receive, send)


async def _drain(receive, size: int, budget: int) -> None:
    """Read and drop the rest of a body, up to `budget` bytes in all."""
    while size <= budget:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(chunks: list[bytes], pending: dict | None, receive):
    """A `receive` that first hands the app the body read already, then the real channel
    (where a disconnect arrives)."""
    first: list[dict] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
    if pending is not None:
        first = [pending]

    async def replay() -> dict:
        if first:
            return first.pop()
        return await receive()

    return replay
