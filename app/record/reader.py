"""Reading a recording (format.py): what `kvdeck replay` draws and `kvdeck plan` fits on.

    with open_recording("session.kvrec") as rec:
        rec.start, rec.end                 # the time range (time.time() seconds)
        rec.engine                         # model, block size, pool, dtype, scheduler limits
        rec.stats_at(t)                    # the EngineStats snapshot at or before t
        rec.snapshots(t0, t1)              # (t, EngineStats) in order
        rec.latencies(t0, t1)              # (kind "ttft" | "itl", at, seconds)
        rec.finished_requests()            # FinishedRequest: timeline, token counts, arrival
        rec.steps()                        # StepRecord per engine step seen

A bad file (missing, not SQLite, not a recording, a newer format version, no snapshots)
raises RecordingError naming the problem. A recording cut short (the process was killed)
opens with what it committed: `complete` is False.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.record.format import (
    CODEC,
    DELTA,
    FINISHED,
    FORMAT_NAME,
    INFO,
    KEYFRAME,
    LATENCY,
    READABLE_VERSIONS,
    STEP,
    RecordingError,
    apply_delta,
    decoded_request,
    decoded_stats,
    unpack_records,
    unpacked_latencies,
)
from kvdeck.engine.types.request_timeline import TimelineSnapshot, timeline_from_dict
from kvdeck.engine.types.stats import EngineStats, RequestStats

CACHED_CHUNKS = 48  # decoded chunks kept: replay's window (each snapshot holds its block map)
STATE = "state"  # a decoded chunk's stats record: (t, STATE, encoded state dict)


@dataclass(slots=True, frozen=True)
class RecordedEngine:
    """The engine a recording was taken on (None: the source did not say)."""

    model: str | None
    block_size: int | None
    num_blocks: int | None  # the KV pool's size
    dtype: str | None
    kv_cache_dtype: str | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool | None
    max_model_len: int | None
    device: str | None


@dataclass(slots=True)
class FinishedRequest:
    request_id: str
    finished_at: float  # time.time() when it was seen finished
    arrival_time: float | None  # time.time() it arrived (None: unknown)
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    finish_reason: str | None
    timeline: TimelineSnapshot | None
    source: str  # "output" (its final output) | "snapshot" (the last snapshot it was in)


@dataclass(slots=True)
class StepRecord:
    step: int
    t: float  # time.time() it was seen
    tokens: int  # tokens the step computed (prefill + decode)
    prefill_tokens: int | None = None  # from a snapshot that described this step
    decode_tokens: int | None = None
    num_seqs: int | None = None
    duration_s: float | None = None
    used_blocks: int | None = None  # KV blocks held after the step (None: not recorded)


@dataclass(slots=True, frozen=True)
class _ChunkRow:
    seq: int
    t0: float
    t1: float
    keyframe: bool
    n_stats: int


def open_recording(path: str | Path) -> Recording:
    return Recording(path)


class Recording:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise RecordingError(f"{self.path}: no such recording file")
        if self.path.stat().st_size == 0:
            raise RecordingError(f"{self.path} is empty: not a kvdeck recording")
        try:  # mode=rw: never create a file; a killed writer's -wal is replayed here
            self._db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True,
                                       check_same_thread=False)
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise RecordingError(f"{self.path} is not a kvdeck recording ({exc})") from exc
        self.meta = meta
        self._check(meta)
        self.info: dict = json.loads(meta.get("info") or "{}")
        self.engine = _recorded_engine(self.info)
        self.complete = "ended_at" in meta  # False: the process was killed while recording
        self.dropped = int(meta.get("dropped") or 0)
        rows = self._db.execute("SELECT seq, t0, t1, keyframe, n_stats, stats_t FROM chunks "
                                "ORDER BY seq").fetchall()
        self._chunks = [_ChunkRow(seq, t0, t1, bool(kf), n) for seq, t0, t1, kf, n, _ in rows]
        first_keyframe = next((i for i, c in enumerate(self._chunks) if c.keyframe), None)
        if first_keyframe is None or not any(c.n_stats for c in self._chunks):
            raise RecordingError(f"{self.path} holds no engine snapshots (an empty recording)")
        self._chunks = self._chunks[first_keyframe:]  # trimmed: decoding starts at a keyframe
        # Every snapshot's time, from the index (no chunk decoded).
        self._times = [t for row in rows[first_keyframe:] for t in json.loads(row[5])]
        self._t1_max: list[float] = []  # running max of chunk end times: a sorted seek key
        for chunk in self._chunks:
            self._t1_max.append(max(chunk.t1, self._t1_max[-1] if self._t1_max else chunk.t1))
        self._decoded: OrderedDict[int, tuple[list, dict | None]] = OrderedDict()

    def _check(self, meta: dict) -> None:
        if meta.get("format") != FORMAT_NAME:
            raise RecordingError(f"{self.path} is not a kvdeck recording (an SQLite file "
                                 "without a kvdeck-recording header)")
        version = int(meta.get("version") or 0)
        if version not in READABLE_VERSIONS:
            raise RecordingError(f"{self.path} is a version {version} recording; this kvdeck "
                                 f"reads versions {', '.join(map(str, READABLE_VERSIONS))}")
        if meta.get("codec") != CODEC:
            raise RecordingError(f"{self.path} is compressed with {meta.get('codec')!r}; this "
                                 f"kvdeck reads {CODEC!r}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the time range --------------------------------------------------------------------
    @property
    def start(self) -> float:
        """The first snapshot's time."""
        return self.snapshot_times()[0]

    @property
    def end(self) -> float:
        return max(self._chunks[-1].t1, self.snapshot_times()[-1])

    def snapshot_times(self) -> list[float]:
        """Every snapshot's time, in order."""
        return self._times

    # ---- snapshots ---------------------------------------------------------------------------
    def stats_at(self, t: float) -> EngineStats | None:
        """The snapshot at or before t (None: t is before the first)."""
        times = self.snapshot_times()
        index = bisect.bisect_right(times, t) - 1
        if index < 0:
            return None
        at = times[index]
        last = None
        for when, state in self._stats_records(at, at):
            if when == at:
                last = state
        return decoded_stats(last) if last is not None else None

    def snapshots(self, t0: float | None = None, t1: float | None = None
                  ) -> Iterator[tuple[float, EngineStats]]:
        for t, state in self._stats_records(t0, t1):
            yield t, decoded_stats(state)

    def snapshot_range(self, first: int, last: int) -> list[EngineStats]:
        """Snapshots number `first` to `last` (inclusive; indexes into snapshot_times())."""
        return [decoded_stats(state) for state in self.snapshot_states(first, last)]

    def snapshot_states(self, first: int, last: int) -> list[dict]:
        """As snapshot_range, in the stored form (format.encoded_stats: read-only, shared
        with the reader's cache): what a caller that needs a few fields of many snapshots
        reads without building each EngineStats; decode_state makes one."""
        times = self.snapshot_times()
        first, last = max(first, 0), min(last, len(times) - 1)
        if first > last:
            return []
        index = bisect.bisect_left(times, times[first])  # the first snapshot at that time
        out = []
        for _, state in self._stats_records(times[first], times[last]):
            if index >= first:
                out.append(state)
            index += 1
            if index > last:
                break
        return out

    @staticmethod
    def decode_state(state: dict) -> EngineStats:
        return decoded_stats(state)

    @staticmethod
    def decode_request(state: dict, request_id: str) -> RequestStats:
        return decoded_request(state, request_id)

    def _stats_records(self, t0: float | None, t1: float | None) -> Iterator[tuple[float, dict]]:
        for t, kind, payload in self._records(t0, t1):
            if kind == STATE and (t0 is None or t >= t0) and (t1 is None or t <= t1):
                yield t, payload

    # ---- events ------------------------------------------------------------------------------
    def latencies(self, t0: float | None = None, t1: float | None = None
                  ) -> list[tuple[str, float, float]]:
        """(kind "ttft" | "itl", when, seconds) in time order."""
        out = []
        for _, kind, payload in self._records(t0, t1):
            if kind == LATENCY:
                for name, packed in payload.items():
                    times, values = unpacked_latencies(packed)
                    out.extend((name, at, seconds) for at, seconds in zip(times, values)
                               if _within(at, t0, t1))
        out.sort(key=lambda sample: sample[1])
        return out

    def finished_requests(self, t0: float | None = None, t1: float | None = None
                          ) -> list[FinishedRequest]:
        """Requests that finished, oldest first; one each (its final output's record when
        there is one, else the last snapshot it was in)."""
        found: dict[str, FinishedRequest] = {}
        for t, kind, payload in self._records(t0, t1):
            if kind != FINISHED or not _within(t, t0, t1):
                continue
            request = _finished(t, payload)
            seen = found.get(request.request_id)
            if seen is None or request.source == "output" or seen.source != "output":
                found.pop(request.request_id, None)
                found[request.request_id] = request
        return sorted(found.values(), key=lambda r: r.finished_at)

    def steps(self, t0: float | None = None, t1: float | None = None) -> list[StepRecord]:
        """One record per step seen, by step number: a local engine's step listener sees
        every step (tokens only); snapshots add the batch's parts and duration for theirs."""
        steps: dict[int, StepRecord] = {}
        for t, kind, payload in self._records(t0, t1):
            if kind != STEP or not _within(t, t0, t1):
                continue
            step, tokens, prefill, decode, seqs, duration = payload[:6]
            used = payload[6] if len(payload) > 6 else None  # version 1: not recorded
            record = steps.get(step)
            if record is None:
                steps[step] = StepRecord(step, t, tokens, prefill, decode, seqs, duration, used)
                continue
            if duration is not None or prefill is not None:
                record.prefill_tokens, record.decode_tokens = prefill, decode
                record.num_seqs, record.duration_s = seqs, duration
            if record.used_blocks is None:
                record.used_blocks = used
        return [steps[n] for n in sorted(steps)]

    def info_changes(self) -> list[tuple[float, dict]]:
        """The engine's description each time it changed during the recording (a restart)."""
        return [(t, payload) for t, kind, payload in self._records(None, None) if kind == INFO]

    # ---- decoding ----------------------------------------------------------------------------
    def _records(self, t0: float | None, t1: float | None) -> Iterator[tuple[float, str, object]]:
        """Records of the chunks that overlap [t0, t1], in file order (stats as states)."""
        chunks = self._chunks
        first = 0 if t0 is None else bisect.bisect_left(self._t1_max, t0)
        for index in range(first, len(chunks)):
            if t1 is not None and chunks[index].t0 > t1:
                break
            records, _ = self._decode(index)
            yield from records

    def _decode(self, index: int) -> tuple[list, dict | None]:
        """A chunk's records with snapshots materialised, and the state after it."""
        seq = self._chunks[index].seq
        cached = self._decoded.get(seq)
        if cached is not None:
            self._decoded.move_to_end(seq)
            return cached
        state = None
        if not self._chunks[index].keyframe:
            state = self._decode(index - 1)[1] if index > 0 else None
        (data,) = self._db.execute("SELECT data FROM chunks WHERE seq = ?", (seq,)).fetchone()
        try:
            raw = unpack_records(data)
        except (zlib.error, ValueError) as exc:
            raise RecordingError(f"{self.path}: chunk {seq} is damaged ({exc})") from exc
        records = []
        for t, kind, payload in raw:
            if kind == KEYFRAME:
                state = payload
                records.append((t, STATE, state))
            elif kind == DELTA:
                if state is None:
                    raise RecordingError(f"{self.path}: chunk {seq} starts with a delta and no "
                                         "keyframe before it")
                state = apply_delta(state, payload)
                records.append((t, STATE, state))
            else:
                records.append((t, kind, payload))
        result = (records, state)
        self._decoded[seq] = result
        while len(self._decoded) > CACHED_CHUNKS:
            self._decoded.popitem(last=False)
        return result


def _within(t: float, t0: float | None, t1: float | None) -> bool:
    return (t0 is None or t >= t0) and (t1 is None or t <= t1)


def _finished(t: float, payload: dict) -> FinishedRequest:
    timeline = payload.get("timeline")
    return FinishedRequest(
        request_id=payload["request_id"], finished_at=t, arrival_time=payload.get("arrival_time"),
        prompt_tokens=int(payload.get("prompt_tokens") or 0),
        output_tokens=int(payload.get("output_tokens") or 0),
        cached_tokens=int(payload.get("cached_tokens") or 0),
        finish_reason=payload.get("finish_reason"),
        timeline=timeline_from_dict(timeline) if timeline else None,
        source=payload.get("source", "snapshot"))


def _recorded_engine(info: dict) -> RecordedEngine:
    def get(key: str, kind: type) -> object:
        value = info.get(key)
        return kind(value) if value is not None else None

    return RecordedEngine(
        model=get("model", str), block_size=get("block_size", int),
        num_blocks=get("num_blocks", int), dtype=get("dtype", str),
        kv_cache_dtype=get("kv_cache_dtype", str), max_num_seqs=get("max_num_seqs", int),
        max_num_batched_tokens=get("max_num_batched_tokens", int),
        enable_prefix_caching=get("enable_prefix_caching", bool),
        max_model_len=get("max_model_len", int), device=get("device", str))
