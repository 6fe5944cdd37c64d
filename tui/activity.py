"""What is running that quitting would cut short: a streaming reply, a load burst, a job.

Each part of the UI that starts such work registers it here with a way to stop it; the
app asks before quitting while anything is registered, and stops everything (waiting for
each to finish and save) before it stops the engine.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

StopFn = Callable[[], Awaitable[object] | object]


@dataclass(slots=True)
class Activity:
    description: str  # e.g. "a chat reply is streaming"
    stop: StopFn


@dataclass(slots=True)
class ActivityTracker:
    _running: dict[str, Activity] = field(default_factory=dict)

    def begin(self, key: str, description: str, stop: StopFn) -> None:
        self._running[key] = Activity(description, stop)

    def end(self, key: str) -> None:
        self._running.pop(key, None)

    def is_running(self, key: str) -> bool:
        return key in self._running

    def descriptions(self) -> list[str]:
        return [a.description for a in self._running.values()]

    async def stop_all(self, timeout: float = 5.0) -> bool:
        """Stop everything and wait until each has ended (True) or `timeout` passed."""
        for activity in list(self._running.values()):
            result = activity.stop()
            if inspect.isawaitable(result):
                await result
        deadline = time.monotonic() + timeout
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self._running
