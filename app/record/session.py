"""What feeds a recording: the TUI's dashboard (its snapshots and latencies, local or
attached), or an engine client directly (`kvdeck --serve --record`), plus, where the engine
runs in this process's client, its final outputs (each finished request's whole timeline)
and its step listener (every step's tokens).

The writer does the work on its own thread; these callbacks only queue items.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from kvdeck.app.record.format import RecordingError
from kvdeck.app.record.writer import DEFAULT_MAX_MB, RecordingWriter, WriterCounters
from kvdeck.engine.types.stats import EngineStats

DEFAULT_TOKEN_BUDGET = {"cuda": 8192, "cpu": 2048}  # the engine's, when max_num_batched_tokens unset
# Snapshots stored a second while the engine is busy (it sends ~15): encoding a busy
# snapshot's 64 requests and diffing them was most of what recording cost the engine. The
# others still give their step record and the requests that left; idle ones, and the first
# busy one after them, are all stored.
SNAPSHOT_HZ = 5.0


def check_record_path(path: str | Path) -> Path:
    """The path `--record` may write (RecordingError naming the problem otherwise), checked
    before the engine starts so a typo costs no model load."""
    path = Path(path).expanduser()
    if path.exists():
        raise RecordingError(f"--record: {path} already exists: record into a new file")
    if not path.parent.is_dir():
        raise RecordingError(f"--record: {path.parent} is not a folder")
    return path


def scheduler_limits(config: Any, device: str | None) -> dict:
    """The scheduler's limits as the engine applies them (its defaults resolved)."""
    budget = config.max_num_batched_tokens or DEFAULT_TOKEN_BUDGET.get(device or "cpu", 2048)
    return {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": budget,
            "enable_prefix_caching": config.enable_prefix_caching}


def engine_description(client: Any, model_name: str) -> dict:
    """What a recording says about its engine: the client's EngineInfo (a local engine) or
    info JSON (an attached kvdeck server), with the scheduler's limits where known."""
    info = getattr(client, "info", None)
    if isinstance(info, dict):
        data = dict(info)
    elif info is not None and dataclasses.is_dataclass(info):
        data = dataclasses.asdict(info)
    else:
        data = {}
    config = getattr(client, "config", None)
    if config is not None and hasattr(config, "max_num_seqs"):
        for key, value in scheduler_limits(config, data.get("device")).items():
            data.setdefault(key, value)
    data["model"] = data.get("model") or model_name
    return data


class SessionRecorder:
    """One recording in progress; every callback is a no-op once it is closed."""

    def __init__(self, path: str | Path, max_mb: float = DEFAULT_MAX_MB,
                 snapshot_hz: float = SNAPSHOT_HZ) -> None:
        if snapshot_hz <= 0:
            raise RecordingError(f"snapshots a second must be above 0, got {snapshot_hz}")
        self.path = check_record_path(path)
        self.writer = RecordingWriter(self.path, max_mb=max_mb)
        self.closed = False
        self._interval = 1.0 / snapshot_hz
        self._stored_t = float("-inf")  # the last stored snapshot's time
        self._held: EngineStats | None = None  # the newest snapshot not stored
        self._idle = True  # the last snapshot seen had nothing running or waiting
        self._last_token: dict[str, float] = {}
        self._watched: list[Any] = []  # clients listened to (each once)

    @property
    def counters(self) -> WriterCounters:
        return self.writer.counters

    # ---- the dashboard's feed ----------------------------------------------------------------
    def on_stats(self, stats: EngineStats) -> None:
        if self.closed:
            return
        idle = not stats.num_running and not stats.num_waiting
        was_idle, self._idle = self._idle, idle
        # Idle ones and the first busy one after them: a short burst is never left out.
        if idle or was_idle or stats.timestamp - self._stored_t >= self._interval:
            self._stored_t, self._held = stats.timestamp, None
            self.writer.add_stats(stats)
        else:
            self._held = stats
            self.writer.add_stats_step(stats)

    def on_latency(self, kind: str, at: float, seconds: float) -> None:
        if not self.closed:
            self.writer.add_latency(kind, at, seconds)

    # ---- an engine client in this process ----------------------------------------------------
    def describe(self, client: Any, model_name: str) -> None:
        """The engine is ready (again): its description."""
        if not self.closed:
            self.writer.set_info(time.time(), engine_description(client, model_name))

    def watch_engine(self, client: Any, *, latencies: bool) -> None:
        """Listen to a local engine client's outputs and steps (an attached server's client
        has neither: its snapshots say what there is). `latencies`: observe TTFT and ITL
        from the outputs too (the server; the TUI's dashboard reports its own)."""
        if any(watched is client for watched in self._watched):
            return
        self._watched.append(client)
        add_output = getattr(client, "add_output_listener", None)
        if add_output is not None:
            add_output(lambda output: self._on_output(output, latencies))
        add_step = getattr(client, "add_step_listener", None)
        if add_step is not None:
            add_step(self._on_steps)

    def _on_steps(self, tokens: list[int], last_step: int, used_blocks: list[int] | None = None,
                  ) -> None:
        if not self.closed:
            self.writer.add_steps(time.time(), list(tokens), last_step,
                                  list(used_blocks) if used_blocks else None)

    def _on_output(self, output: Any, latencies: bool) -> None:
        if self.closed:
            return
        if latencies:
            self._observe_latency(output)
        if output.finished:
            self._last_token.pop(output.request_id, None)
            self.writer.add_finished(time.time(), finished_payload(output))

    def _observe_latency(self, output: Any) -> None:
        metrics = output.metrics
        new, now = len(output.delta_token_ids), metrics.last_token_time
        if not new or now is None:
            return
        previous = self._last_token.get(output.request_id)
        if previous is None and metrics.time_to_first_token is not None:
            self.writer.add_latency("ttft", now, metrics.time_to_first_token)
        elif previous is not None:
            for _ in range(new):  # several tokens in one step share the interval
                self.writer.add_latency("itl", now, max(0.0, now - previous) / new)
        self._last_token[output.request_id] = now

    def close(self) -> None:
        if not self.closed:
            if self._held is not None:  # the last moment seen ends the recording
                self.writer.add_stats(self._held)
            self.closed = True
            self.writer.close()


def finished_payload(output: Any) -> dict:
    """A finished request's record from its final output (reader.FinishedRequest)."""
    timeline = output.metrics.timeline
    return {
        "request_id": output.request_id, "source": "output",
        "arrival_time": output.metrics.arrival_time,
        "prompt_tokens": len(output.prompt_token_ids),
        "output_tokens": sum(len(choice.token_ids) for choice in output.outputs),
        "cached_tokens": output.num_cached_tokens,
        "finish_reason": output.outputs[0].finish_reason if output.outputs else None,
        "timeline": dataclasses.asdict(timeline) if timeline is not None else None}


async def record_engine(client: Any, recorder: SessionRecorder, model_name: str) -> None:
    """`kvdeck --serve --record`: every snapshot the engine sends, across restarts (a task
    the server's lifespan runs and cancels)."""
    recorder.watch_engine(client, latencies=True)
    while not recorder.closed:
        if client.health().status != "ready":
            await asyncio.sleep(0.2)
            continue
        recorder.describe(client, model_name)
        try:
            async for stats in client.stats_stream():
                recorder.on_stats(stats)
        except Exception:  # the engine died: its restart is the server's business
            await asyncio.sleep(0.2)
