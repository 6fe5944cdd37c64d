"""The dashboard's feed over HTTP, for `kvdeck attach`: the engine's snapshots as
Server-Sent Events (GET /kvdeck/v1/stats), the same ones the local TUI draws (block map
with owners and sharing, cached and written blocks, request states and block tables, the
last step's batch), plus the TTFT and inter-token latencies observed since the previous
event and the final figures of the requests that finished since then. Snapshots arrive at
the engine's own throttle (about 15 a second while busy, one a second idle); while the
engine is down the stream says so once a second and resumes.
"""

import asyncio
import dataclasses
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from kvdeck.app.record.session import scheduler_limits
from kvdeck.engine.api.async_llm import AsyncLLM, EngineDeadError
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.stats import final_request_stats, request_stats_to_dict, stats_to_dict

LATENCY_BACKLOG = 4096  # samples kept for a slow reader
ENDED_BACKLOG = 256  # finished requests' final figures kept for a slow reader
DOWN_POLL_S = 1.0


@dataclass(slots=True)
class LatencySample:
    number: int  # increasing, so each reader sends only what it has not sent
    kind: str  # "ttft" | "itl"
    timestamp: float  # when the token arrived (time.time())
    seconds: float


class LatencyFeed:
    """TTFT and ITL of every request, observed as outputs stream by (an output listener)."""

    def __init__(self) -> None:
        self.samples: deque[LatencySample] = deque(maxlen=LATENCY_BACKLOG)
        self._count = 0
        self._last_token: dict[str, float] = {}

    def observe(self, output: RequestOutput) -> None:
        metrics = output.metrics
        new = len(output.delta_token_ids)
        now = metrics.last_token_time
        if new and now is not None:
            previous = self._last_token.get(output.request_id)
            if previous is None and metrics.time_to_first_token is not None:
                self._add("ttft", now, metrics.time_to_first_token)
            elif previous is not None:
                for _ in range(new):  # several tokens in one step share the interval
                    self._add("itl", now, max(0.0, now - previous) / new)
            self._last_token[output.request_id] = now
        if output.finished:
            self._last_token.pop(output.request_id, None)

    def _add(self, kind: str, timestamp: float, seconds: float) -> None:
        self._count += 1
        self.samples.append(LatencySample(self._count, kind, timestamp, seconds))

    def since(self, number: int) -> tuple[list[LatencySample], int]:
        fresh = []
        for sample in reversed(self.samples):  # newest first: stop at what was sent
            if sample.number <= number:
                break
            fresh.append(sample)
        fresh.reverse()
        return fresh, (fresh[-1].number if fresh else number)


class EndedFeed:
    """Finished requests' final figures, from their final outputs (an output listener): an
    attached dashboard's last snapshot of a request predates its last steps."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, dict]] = deque(maxlen=ENDED_BACKLOG)
        self._count = 0

    def observe(self, output: RequestOutput) -> None:
        if output.finished:
            self._count += 1
            self.entries.append((self._count, request_stats_to_dict(final_request_stats(output))))

    def since(self, number: int) -> tuple[list[dict], int]:
        fresh = [(n, entry) for n, entry in self.entries if n > number]
        return [entry for _, entry in fresh], (fresh[-1][0] if fresh else number)


def engine_info(client: AsyncLLM, model_name: str) -> dict:
    """What /kvdeck/v1/info says: the engine's EngineInfo and its scheduler's limits (what an
    attached dashboard's recording keeps for `kvdeck plan`)."""
    info = client.info
    return {"model": model_name, "engine": "kvdeck", "health": client.health().status,
            **(dataclasses.asdict(info) if info is not None else {}),
            **scheduler_limits(client.config, info.device if info is not None else None)}


async def stats_events(client: AsyncLLM, feed: LatencyFeed, ended: EndedFeed, model_name: str,
                       request: Request) -> AsyncIterator[str]:
    sent = feed.since(0)[1]  # latencies from before the reader connected are not its business
    ended_sent = ended.since(0)[1]
    yield _event("info", engine_info(client, model_name))
    while not await request.is_disconnected():
        health = client.health()
        if health.status != "ready":
            yield _event("health", {"status": health.status, "detail": health.detail})
            await asyncio.sleep(DOWN_POLL_S)
            continue
        yield _event("info", engine_info(client, model_name))
        try:
            async for stats in client.stats_stream():
                fresh, sent = feed.since(sent)
                finished, ended_sent = ended.since(ended_sent)
                yield _event("stats", {
                    "stats": stats_to_dict(stats),
                    "latencies": [[s.kind, s.timestamp, s.seconds] for s in fresh],
                    "ended": finished})
                if await request.is_disconnected():
                    return
        except EngineDeadError:
            continue  # reported by the health event above, until it is back


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
