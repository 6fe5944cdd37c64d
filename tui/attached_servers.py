"""The servers `kvdeck attach URL...` watches: one row each for the dashboard, and their sum.

Each URL gets a monitor client of its own that scrapes the server's /metrics (vLLM's names,
which kvdeck's server exports too) and reconnects by itself; the chat and the block map
talk to one of them, the selected server, through the app's ordinary engine client. A
server that is unreachable keeps its last figures, marked disconnected, so the table greys
them instead of showing zeros; a refused API key stops that server's retries and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvdeck.tui.engine_protocol import ClientFactory

if TYPE_CHECKING:
    from kvdeck.app.attach.metrics_view import MetricsView
    from kvdeck.app.attach.remote_client import RemoteClient


@dataclass(slots=True)
class ServerRow:
    url: str
    engine: str  # "kvdeck", "vLLM", "server", or "?" before the first answer
    status: str  # "starting" | "ready" | "dead" | "stopped"
    detail: str
    view: MetricsView | None  # the last figures (kept while disconnected)
    selected: bool  # the one the chat and the block map talk to

    @property
    def connected(self) -> bool:
        return self.status == "ready"


class AttachedServers:
    def __init__(self, urls: list[str], api_key: str | None = None,
                 make_client: Callable[[str, str | None], RemoteClient] | None = None) -> None:
        if not urls:
            raise ValueError("attach needs at least one server URL")
        if make_client is None:
            from kvdeck.app.attach.remote_client import RemoteClient

            make_client = RemoteClient
        self.make_client = make_client
        self.api_key = api_key
        self.monitors = [make_client(url, api_key) for url in urls]  # normalises each URL
        self.urls = [monitor.url for monitor in self.monitors]
        self.selected = 0
        self.version = 0  # bumped on every change the table should draw
        self._tasks: list[asyncio.Task] = []

    def __len__(self) -> int:
        return len(self.urls)

    def client_factory(self, index: int | None = None) -> ClientFactory:
        """Makes the chat's client for a server (the selected one by default)."""
        url = self.urls[self.selected if index is None else index]
        return lambda: self.make_client(url, self.api_key)

    def select_next(self) -> str:
        self.selected = (self.selected + 1) % len(self.urls)
        self.version += 1
        return self.urls[self.selected]

    # ---- watching ---------------------------------------------------------------------------
    async def watch(self) -> None:
        """Scrape every server until close(); run as a worker of the app."""
        self._tasks = [asyncio.create_task(self._watch_one(m)) for m in self.monitors]
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.close()

    async def _watch_one(self, monitor: RemoteClient) -> None:
        from kvdeck.app.attach.connection import Backoff, RemoteAuthError

        backoff = Backoff()
        while monitor.health().status != "stopped":
            try:
                await monitor.start()
                self.version += 1
                if not monitor.has_metrics:
                    return  # nothing more to learn; its row says so
                async for _ in monitor.metrics_stream():
                    self.version += 1
                return
            except RemoteAuthError:
                self.version += 1
                return  # retrying with the same key cannot help
            except asyncio.CancelledError:
                raise
            except Exception:  # unreachable or not (yet) an OpenAI server: try again later
                self.version += 1
                await asyncio.sleep(backoff.next_delay())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for monitor in self.monitors:
            with contextlib.suppress(Exception):
                await monitor.shutdown()

    # ---- what the table draws ----------------------------------------------------------------
    def rows(self) -> list[ServerRow]:
        rows = []
        for index, monitor in enumerate(self.monitors):
            health = monitor.health()
            engine = monitor.engine_label if monitor.kind != "unknown" else "?"
            detail = health.detail
            if monitor.kind != "unknown" and not monitor.has_metrics:
                detail = "no /metrics: only its chat works"
            rows.append(ServerRow(monitor.url, engine, health.status, detail,
                                  monitor.last_metrics, index == self.selected))
        return rows

    def summed(self) -> MetricsView | None:
        """Every server's last figures as one deployment (None while none has any)."""
        from kvdeck.app.attach.metrics_view import combine

        views = [m.last_metrics for m in self.monitors if m.last_metrics is not None]
        return combine(views) if views else None
