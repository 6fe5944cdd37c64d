"""The recording file's format: one SQLite database (stdlib sqlite3) of zlib-compressed chunks.

Tables:
  meta(key, value)  -- "format" = FORMAT_NAME, "version" = FORMAT_VERSION, "codec" = "zlib",
                       "info" = the engine's description (JSON), "started_at", "ended_at",
                       "dropped" (records the writer could not keep up with), "trimmed_before"
  chunks(seq, t0, t1, keyframe, n_stats, stats_t, nbytes, data) -- ~CHUNK_S of records
                       each, in time order, indexed by t0; `keyframe` = 1 when its first
                       stats record is a full snapshot (decoding may start there); stats_t
                       the JSON list of its snapshots' times (the index replay seeks on).

A chunk's data is zlib(JSON list of records), each record [t, kind, payload]:
  "K" a full stats snapshot (encoded_stats), "D" a delta against the previous snapshot,
  "L" the chunk's latencies {kind "ttft"|"itl": [first time, [microseconds after it],
      [microseconds]]} (t: the first's; version 1: [[times], [seconds]]),
  "F" a finished request (dict),
  "S" a step [step, tokens, prefill_tokens, decode_tokens, num_seqs, duration_s, used_blocks]
  (None where the source did not say; used_blocks, the KV blocks held after the step, is
  absent from version 1 files), "I" the engine's description changed (a restarted engine).
t is wall-clock seconds (time.time(), the stats' own clock).

Snapshots are stored in stats_to_dict's form (read back with stats_from_dict, which ignores
fields it does not know, so recordings from a newer engine still open), with the requests
keyed by id and the two per-block lists as plain lists, so a delta carries only what changed:
changed fields, nested dicts field by field, and the per-block lists as (index, value) pairs.
"""

from __future__ import annotations

import dataclasses
import json
import zlib

from kvdeck.engine.types.stats import EngineStats, RequestStats, stats_from_dict

FORMAT_NAME = "kvdeck-recording"
FORMAT_VERSION = 2  # 2: a step record's used_blocks, latencies as integer microseconds
READABLE_VERSIONS = (1, 2)
CODEC = "zlib"
ZLIB_LEVEL = 1  # 6 packed a busy session 7% smaller for 25% more of the writer's CPU

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    seq INTEGER PRIMARY KEY, t0 REAL NOT NULL, t1 REAL NOT NULL, keyframe INTEGER NOT NULL,
    n_stats INTEGER NOT NULL, stats_t TEXT NOT NULL, nbytes INTEGER NOT NULL,
    data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_t0 ON chunks (t0);
"""

KEYFRAME, DELTA, LATENCY, FINISHED, STEP, INFO = "K", "D", "L", "F", "S", "I"
ORDER = "_order"  # the requests' ids in the snapshot's order
SPARSE_KEYS = ("block_ref_counts", "block_is_cached")  # per-block: diffed element-wise
DIFF_SLICE = 128  # blocks compared at once when looking for the changed ones
SPARSE_MAX_SHARE = 0.25  # more changed than this: the whole list is stored


class RecordingError(ValueError):
    """A recording cannot be written or read: the message names the file and the problem."""


def encoded_stats(stats: EngineStats) -> dict:
    """A snapshot as the file stores it: stats_to_dict's form (lists shared with `stats`,
    never mutated), but the reference counts as a plain list (a list diffs; base64 would
    not), built with each class's field names looked up once (stats_to_dict asks
    dataclasses for them field by field: 7 ms a busy snapshot, most of recording's cost)."""
    data = as_plain_dict(stats)
    data["block_is_cached"] = bytes(stats.block_is_cached).translate(_FLAG_DIGITS).decode()
    requests = data.pop("requests")
    data["requests"] = {r["request_id"]: r for r in requests}
    data[ORDER] = list(data["requests"])
    return data


_FLAG_DIGITS = bytes.maketrans(b"\x00\x01", b"01")
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def as_plain_dict(value: object) -> dict:
    """A dataclass as a dict, nested dataclasses (alone or in a list) too; other values shared."""
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    out = {}
    for name in names:
        item = getattr(value, name)
        kind = type(item)
        if kind in _PLAIN:
            pass
        elif kind is list:
            if item and type(item[0]) not in _PLAIN and hasattr(type(item[0]), "__dataclass_fields__"):
                item = [as_plain_dict(element) for element in item]
        elif hasattr(kind, "__dataclass_fields__"):
            item = as_plain_dict(item)
        out[name] = item
    return out


_PLAIN = frozenset({int, float, str, bool, type(None), tuple, dict})


def decoded_stats(state: dict) -> EngineStats:
    data = dict(state)
    requests = data.pop("requests", {})
    data["requests"] = [requests[rid] for rid in data.pop(ORDER, requests)]
    return stats_from_dict(data)


def decoded_request(state: dict, request_id: str) -> RequestStats:
    """One request of a stored snapshot (its block map left out: nothing of it is needed)."""
    light = {**state, "block_ref_counts": [], "block_is_cached": "", "block_group": [],
             "requests": {request_id: state["requests"][request_id]}, ORDER: [request_id]}
    return decoded_stats(light).requests[0]


def stats_delta(prev: dict, new: dict) -> dict:
    """What turns `prev` into `new` (apply_delta): see _dict_delta; the per-block lists as
    {"x": {key: [[index, value], ...]}} while few of them changed."""
    sparse = {}
    plain_prev, plain_new = prev, new
    for key in SPARSE_KEYS:
        before, after = prev.get(key), new.get(key)
        if before is None or after is None or before is after or len(before) != len(after):
            continue
        changed = _changes(before, after) if before != after else []
        if len(changed) <= SPARSE_MAX_SHARE * len(after):
            if plain_prev is prev:
                plain_prev, plain_new = dict(prev), dict(new)
            del plain_prev[key], plain_new[key]
            if changed:
                sparse[key] = changed
    delta = _dict_delta(plain_prev, plain_new)
    if sparse:
        delta["x"] = sparse
    return delta


def _changes(before: list | str, after: list | str) -> list:
    """[index, value] where the two differ: slices compared in C first, so a busy step's
    few changed blocks of 10,922 cost microseconds, not a Python loop over every block."""
    changed = []
    for start in range(0, len(after), DIFF_SLICE):
        end = start + DIFF_SLICE
        if before[start:end] != after[start:end]:
            changed.extend([i, after[i]] for i in range(start, min(end, len(after)))
                           if before[i] != after[i])
    return changed


def _gone(prev: dict, new: dict) -> list:
    return [key for key in prev if key not in new]


def _dict_delta(prev: dict, new: dict) -> dict:
    """{"s": changed or new keys' values, "d": nested dicts' deltas, "g": removed keys}."""
    changed, nested = {}, {}
    for key, value in new.items():
        if key not in prev:
            changed[key] = value
            continue
        old = prev[key]
        if old is value or old == value:
            continue
        if isinstance(value, dict) and isinstance(old, dict):
            nested[key] = _dict_delta(old, value)
        else:
            changed[key] = value
    delta: dict = {}
    if changed:
        delta["s"] = changed
    if nested:
        delta["d"] = nested
    if len(prev) + sum(key not in prev for key in changed) > len(new):  # some key left
        delta["g"] = _gone(prev, new)
    return delta


def apply_delta(prev: dict, delta: dict) -> dict:
    """A new state: `prev` is left as it was (states already handed out stay valid)."""
    out = dict(prev)
    out.update(delta.get("s", {}))
    for key, nested in delta.get("d", {}).items():
        out[key] = apply_delta(prev[key], nested)
    for key in delta.get("g", ()):
        out.pop(key, None)
    for key, changes in delta.get("x", {}).items():
        values = prev[key]
        if isinstance(values, str):
            chars = bytearray(values.encode())
            for index, value in changes:
                chars[index] = ord(value)
            out[key] = chars.decode()
        else:
            values = list(values)
            for index, value in changes:
                values[index] = value
            out[key] = values
    return out


def packed_latencies(times: list[float], seconds: list[float]) -> list:
    """A kind's latencies as a LATENCY record stores them: integers, which JSON writes and
    zlib packs several times faster than 17-digit floats (4,000 a second at 64 streams)."""
    first = min(times)
    return [first, [round((t - first) * 1e6) for t in times], [round(v * 1e6) for v in seconds]]


def unpacked_latencies(payload: list) -> tuple[list[float], list[float]]:
    """(times, seconds) from packed_latencies' form, or version 1's plain columns."""
    if len(payload) == 2:
        return payload[0], payload[1]
    first, offsets, micros = payload
    return [first + d / 1e6 for d in offsets], [m / 1e6 for m in micros]


def pack_records(records: list) -> bytes:
    return zlib.compress(json.dumps(records, separators=(",", ":")).encode(), ZLIB_LEVEL)


def unpack_records(data: bytes) -> list:
    return json.loads(zlib.decompress(data))
