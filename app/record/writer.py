"""Writes a recording (format.py) from a thread of its own, so the event loop that feeds it
(the TUI's, the server's) only puts items on a bounded queue: a full queue drops the item
and counts it (meta "dropped"), it never blocks the engine's consumer.

Crash-safe: each ~1 s chunk is one committed transaction in WAL mode, so a killed process
leaves every chunk committed before it (SQLite replays the -wal file when the recording is
opened). Bounded: past max_bytes of chunk data the oldest chunks are deleted, up to the next
keyframe, so what remains still decodes from its first chunk (meta "trimmed_before").
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvdeck.app.record.format import (
    CODEC,
    DELTA,
    FINISHED,
    FORMAT_NAME,
    FORMAT_VERSION,
    INFO,
    KEYFRAME,
    LATENCY,
    SCHEMA,
    STEP,
    RecordingError,
    as_plain_dict,
    encoded_stats,
    pack_records,
    packed_latencies,
    stats_delta,
)
from kvdeck.engine.types.stats import EngineStats

logger = logging.getLogger(__name__)

CHUNK_S = 1.0  # a chunk spans about this much time (the crash-safety granularity)
KEYFRAME_S = 10.0  # a full snapshot at least this often (how far a seek decodes)
QUEUE_LEN = 20_000  # items waiting for the writer thread
DEFAULT_MAX_MB = 20.0
DRAIN_S = 0.05  # the writer thread's nap when nothing is queued
_STOP = object()
_SECOND_RECORD = "second"  # a finished request already recorded from its final output


@dataclass(slots=True)
class WriterCounters:
    chunks: int = 0
    records: int = 0
    bytes: int = 0  # compressed chunk data currently in the file
    dropped: int = 0  # items the queue had no room for
    trimmed_chunks: int = 0  # oldest chunks deleted to stay under max_bytes
    thread_cpu_s: float = 0.0  # CPU time the writer thread used (set when it ends)


@dataclass(slots=True)
class _Chunk:
    records: list = field(default_factory=list)
    opened: float = 0.0  # time.monotonic() of its first record
    first_t: float = 0.0  # its first record's time
    keyframe: bool = False
    n_stats: int = 0
    # Latencies by kind, (times, seconds) columns: one record a chunk (a record each, 4,000
    # a second at 64 streams, was most of the writer's work).
    latencies: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.records and not self.latencies


class RecordingWriter:
    def __init__(self, path: str | Path, info: dict | None = None, *,
                 max_mb: float = DEFAULT_MAX_MB, chunk_s: float = CHUNK_S,
                 keyframe_s: float = KEYFRAME_S, queue_len: int = QUEUE_LEN) -> None:
        if max_mb <= 0:
            raise RecordingError(f"the recording's size cap must be above 0 MB, got {max_mb}")
        self.path = Path(path)
        if self.path.exists():
            raise RecordingError(f"{self.path} already exists: record into a new file")
        if not self.path.parent.is_dir():
            raise RecordingError(f"{self.path.parent} is not a folder")
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.chunk_s = chunk_s
        self.keyframe_s = keyframe_s
        self.counters = WriterCounters()
        # A deque, not a queue.Queue: an append is one atomic call with no lock and no wake-up
        # (4,000 latencies a second would otherwise hand the GIL to this thread each time);
        # the thread drains it every DRAIN_S.
        self._queue: deque = deque()
        # Latencies on a queue of their own (4,000 a second at 64 streams): drained in bulk
        # into the open chunk's columns, not dispatched one by one.
        self._latencies: deque[tuple[str, float, float]] = deque()
        self._queue_len = queue_len
        self._db = self._create(info or {})
        self._thread = threading.Thread(target=self._run, name="kvdeck-recorder", daemon=True)
        self._closed = False
        self.error: str | None = None  # why the writer thread stopped early (disk full...)
        # Writer-thread state.
        self._chunk = _Chunk()
        self._prev_state: dict | None = None  # the last snapshot stored, encoded
        self._prev_stats: EngineStats | None = None  # the last snapshot seen
        self._last_keyframe_t = float("-inf")
        self._finished_ids: dict[str, None] = {}  # recorded from final outputs (bounded)
        self._last_stats_step = -1
        self._info: dict | None = None  # a new engine description, not yet in meta
        self._thread.start()

    def _create(self, info: dict) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise RecordingError(f"cannot create {self.path}: {exc}") from exc
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # a killed process loses nothing committed
        db.executescript(SCHEMA)
        now = time.time()
        with db:
            db.execute("BEGIN")
            db.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("format", FORMAT_NAME), ("version", str(FORMAT_VERSION)), ("codec", CODEC),
                ("info", json.dumps(info)), ("started_at", repr(now)), ("dropped", "0"),
                ("trimmed_before", "")])
        return db

    # ---- producers (any thread; never block) ------------------------------------------------
    def add_stats(self, stats: EngineStats) -> None:
        self._put(("stats", stats))

    def add_stats_step(self, stats: EngineStats) -> None:
        """A snapshot not stored (a recorder's throttle): its step record, and the requests
        gone since the previous snapshot, are written all the same."""
        self._put(("stats_step", stats))

    def add_latency(self, kind: str, at: float, seconds: float) -> None:
        if self._closed or self.error is not None:
            return
        if len(self._latencies) >= self._queue_len:
            self.counters.dropped += 1
        else:
            self._latencies.append((kind, at, seconds))

    def add_finished(self, at: float, request: dict) -> None:
        """A finished request from its final output: FINISHED's payload (see recorder.py)."""
        self._put(("finished", at, request))

    def add_steps(self, at: float, tokens: list[int], last_step: int,
                  used_blocks: list[int] | None = None) -> None:
        """Tokens of each engine step since the previous call (a step listener); the last
        of them is the engine's step `last_step`; `used_blocks`, where given, the KV blocks
        held after each of them."""
        if used_blocks and len(used_blocks) != len(tokens):
            raise RecordingError(f"{len(tokens)} steps' tokens but {len(used_blocks)} steps' "
                                 "used blocks")
        self._put(("steps", at, tokens, last_step, used_blocks or None))

    def set_info(self, at: float, info: dict) -> None:
        """The engine's description (known once it is ready; again after a restart)."""
        self._put(("info", at, info))

    def _put(self, item: Any) -> None:
        if self._closed or self.error is not None:
            return
        if len(self._queue) >= self._queue_len:
            self.counters.dropped += 1
        else:
            self._queue.append(item)

    def close(self) -> None:
        """Write what is queued, then leave one self-contained file (no -wal beside it)."""
        if self._closed:
            return
        self._closed = True
        self._queue.append(_STOP)
        self._thread.join()

    # ---- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            pending, latencies = self._queue, self._latencies
            while True:
                if not pending:
                    time.sleep(DRAIN_S)
                if latencies:
                    self._add_latencies()
                item = pending.popleft() if pending else None
                if item is _STOP:
                    break
                if item is not None:
                    self._handle(item)
                chunk = self._chunk
                if not chunk.empty and time.monotonic() - chunk.opened >= self.chunk_s:
                    self._flush()
            self._add_latencies()
            self._flush()
            self._finish()
        except Exception as exc:  # what was committed stays readable; the rest is lost
            self.error = f"{type(exc).__name__}: {exc}"
            logger.exception("recording into %s stopped", self.path)
        finally:
            self._db.close()
            self.counters.thread_cpu_s = time.thread_time()

    def _chunk_for(self, t: float) -> _Chunk:
        """The chunk a record at t goes in: a chunk spans chunk_s of recorded time, however
        fast the records arrive."""
        chunk = self._chunk
        empty = chunk.empty
        if not empty and abs(t - chunk.first_t) >= self.chunk_s:
            self._flush()
            chunk, empty = self._chunk, True
        if empty:
            chunk.opened, chunk.first_t = time.monotonic(), t
        self.counters.records += 1
        return chunk

    def _append(self, record: list) -> None:
        self._chunk_for(record[0]).records.append(record)

    def _add_latencies(self) -> None:
        """Every latency queued, into the chunk open at the first one's time."""
        queued = self._latencies
        if not queued:
            return
        count = len(queued)
        columns_of = self._chunk_for(queued[0][1]).latencies
        self.counters.records += count - 1
        pop = queued.popleft
        for _ in range(count):
            name, at, seconds = pop()
            columns = columns_of.get(name)
            if columns is None:
                columns = columns_of[name] = ([], [])
            columns[0].append(at)
            columns[1].append(seconds)

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "stats":
            self._add_stats(item[1])
        elif kind == "stats_step":
            self._vanished(item[1])
            self._add_stats_step(item[1])
        elif kind == "finished":
            _, at, request = item
            self._finished_ids[request["request_id"]] = None
            while len(self._finished_ids) > 4096:
                self._finished_ids.pop(next(iter(self._finished_ids)))
            self._append([at, FINISHED, request])
        elif kind == "steps":
            _, at, tokens, last_step, used_blocks = item
            first = last_step - len(tokens) + 1
            for i, count in enumerate(tokens):
                used = used_blocks[i] if used_blocks else None
                self._append([at, STEP, [first + i, count, None, None, None, None, used]])
        elif kind == "info":
            self._append([item[1], INFO, item[2]])
            self._info = item[2]  # the meta row follows with the chunk's commit

    def _add_stats(self, stats: EngineStats) -> None:
        self._vanished(stats)
        state = encoded_stats(stats)
        t = stats.timestamp
        prev = self._prev_state
        chunk = self._chunk
        if chunk.records and abs(t - chunk.first_t) >= self.chunk_s:
            self._flush()
            chunk = self._chunk
        if prev is None or (chunk.n_stats == 0 and t - self._last_keyframe_t >= self.keyframe_s):
            if chunk.n_stats:  # a keyframe opens its chunk: a seek decodes from there
                self._flush()
                chunk = self._chunk
            self._append([t, KEYFRAME, state])
            self._chunk.keyframe = True
            self._last_keyframe_t = t
        else:
            self._append([t, DELTA, stats_delta(prev, state)])
        self._chunk.n_stats += 1
        self._prev_state = state
        self._add_stats_step(stats)

    def _add_stats_step(self, stats: EngineStats) -> None:
        """The step a snapshot describes (its batch's parts and duration), once per step."""
        t = stats.timestamp
        if stats.num_steps > 0 and stats.num_steps != self._last_stats_step:
            self._last_stats_step = stats.num_steps
            self._append([t, STEP, [stats.num_steps,
                                    stats.last_step_prefill_tokens + stats.last_step_decode_tokens,
                                    stats.last_step_prefill_tokens, stats.last_step_decode_tokens,
                                    stats.last_step_num_seqs, stats.last_step_duration_s,
                                    stats.num_blocks - stats.num_free_blocks]])

    def _vanished(self, stats: EngineStats) -> None:
        """Requests gone since the previous snapshot (stored or not) finished (or were
        aborted): their last seen state is their record, unless their final output was
        recorded already."""
        prev, self._prev_stats = self._prev_stats, stats
        if prev is None:
            return
        current = {r.request_id for r in stats.requests}
        for request in prev.requests:
            rid = request.request_id
            if rid in current or rid in self._finished_ids:
                continue
            timeline = as_plain_dict(request.timeline) if request.timeline is not None else {}
            queued, taken = timeline.get("queued_at"), timeline.get("taken_at")
            arrival = prev.timestamp - (taken - queued) if queued is not None and taken else None
            self._append([stats.timestamp, FINISHED, {
                "request_id": rid, "source": "snapshot", "arrival_time": arrival,
                "prompt_tokens": request.num_prompt_tokens,
                "output_tokens": request.num_output_tokens,
                "cached_tokens": request.num_cached_tokens,
                "finish_reason": timeline.get("finish_reason"), "timeline": timeline or None}])

    def _flush(self) -> None:
        chunk, self._chunk = self._chunk, _Chunk()
        if chunk.empty:
            return
        times = [record[0] for record in chunk.records]
        stats_t = [record[0] for record in chunk.records if record[1] in (KEYFRAME, DELTA)]
        if chunk.latencies:
            spans = [(min(ts), max(ts)) for ts, _ in chunk.latencies.values()]
            times += [t for span in spans for t in span]
            chunk.records.append([min(s[0] for s in spans), LATENCY,
                                  {name: packed_latencies(ts, vs)
                                   for name, (ts, vs) in chunk.latencies.items()}])
        data = pack_records(chunk.records)
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT INTO chunks (t0, t1, keyframe, n_stats, stats_t, nbytes, data) "
                "VALUES (?,?,?,?,?,?,?)",
                (min(times), max(times), int(chunk.keyframe), chunk.n_stats,
                 json.dumps(stats_t), len(data), data))
            self.counters.bytes += len(data)
            self._trim()
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'dropped'",
                             (str(self.counters.dropped),))
            if self._info is not None:
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'info'",
                                 (json.dumps(self._info),))
                self._info = None
        self.counters.chunks += 1

    def _trim(self) -> None:
        """Over the cap: delete the oldest chunks, up to (not including) a keyframe chunk."""
        db = self._db
        while self.counters.bytes > self.max_bytes:
            rows = db.execute("SELECT seq, keyframe, nbytes, t0 FROM chunks ORDER BY seq LIMIT 64"
                              ).fetchall()
            if len(rows) < 2:
                return
            later_keyframe = next((row for row in rows[1:] if row[1]), None)
            if later_keyframe is None:  # no keyframe soon: keep the file decodable, over cap
                return
            gone = [row for row in rows if row[0] < later_keyframe[0]]
            db.execute("DELETE FROM chunks WHERE seq < ?", (later_keyframe[0],))
            self.counters.bytes -= sum(row[2] for row in gone)
            self.counters.trimmed_chunks += len(gone)
            db.execute("UPDATE meta SET value = ? WHERE key = 'trimmed_before'",
                       (repr(later_keyframe[3]),))

    def _finish(self) -> None:
        db = self._db
        with db:
            db.execute("BEGIN")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('ended_at', ?)", (repr(time.time()),))
            db.execute("UPDATE meta SET value = ? WHERE key = 'dropped'",
                       (str(self.counters.dropped),))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
