"""Graceful shutdown: on SIGTERM (or ctrl+c) the server stops taking requests at once, lets
the streams in flight finish for a grace period, then ends the rest with an SSE error
event and `[DONE]` (a non-streamed request gets a 503) before uvicorn closes.
"""

import asyncio
import time

import uvicorn

DEFAULT_GRACE_S = 10.0


class Drain:
    """Shared by the routes: whether the server is draining, and when streams must stop."""

    def __init__(self) -> None:
        self.draining = False
        self.deadline: float | None = None  # time.monotonic() when what is left gets cut
        self._expired: asyncio.Event | None = None

    @property
    def expired(self) -> asyncio.Event:
        if self._expired is None:  # created on the server's loop, the first time it is asked
            self._expired = asyncio.Event()
        return self._expired

    def begin(self, grace_s: float, loop: asyncio.AbstractEventLoop) -> None:
        if self.draining:
            return
        self.draining = True
        self.deadline = time.monotonic() + grace_s
        loop.call_soon_threadsafe(lambda: loop.call_later(grace_s, self.expired.set))

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic()) if self.deadline is not None else 0.0


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, grace_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.grace_s = grace_s
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self.loop is not None:
            self.drain.begin(self.grace_s, self.loop)
        super().handle_exit(sig, frame)
