"""A recording reads back every moment exactly as it was written."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from kvdeck.app.record.format import STEP, pack_records, unpack_records
from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.writer import RecordingWriter
from tests.record.synthetic import DT, ENGINE_INFO, T0, session_stats


def write_session(path, stats, *, keyframe_s=1.0, chunk_s=0.35, **kwargs):
    writer = RecordingWriter(path, ENGINE_INFO, keyframe_s=keyframe_s, chunk_s=chunk_s, **kwargs)
    for i, snapshot in enumerate(stats):
        writer.add_stats(snapshot)
        writer.add_latency("ttft" if i % 5 == 0 else "itl", snapshot.timestamp, 0.01 * (i % 7))
        writer.add_steps(snapshot.timestamp, [5, 6, 7], 3 * i + 3)
    writer.add_finished(stats[-1].timestamp, {
        "request_id": "req-2", "source": "output", "arrival_time": T0 + 10 * DT,
        "prompt_tokens": 64, "output_tokens": 17, "cached_tokens": 16, "finish_reason": "length",
        "timeline": None})
    writer.close()
    return writer


def test_every_snapshot_reads_back_exactly(tmp_path):
    stats = session_stats(60)
    path = tmp_path / "s.kvrec"
    writer = write_session(path, stats)
    assert writer.counters.chunks > 10 and writer.counters.dropped == 0
    with open_recording(path) as rec:
        assert rec.complete
        assert rec.start == stats[0].timestamp and rec.end == pytest.approx(stats[-1].timestamp)
        assert [s for _, s in rec.snapshots()] == stats
        # Seeking anywhere (backwards too) gives the snapshot at or before that time.
        for i in (59, 3, 31, 0, 17, 44):
            assert rec.stats_at(stats[i].timestamp) == stats[i]
            assert rec.stats_at(stats[i].timestamp + DT / 2) == stats[i]
        assert rec.stats_at(T0 - 1) is None
        assert rec.engine.block_size == 16 and rec.engine.max_num_seqs == 8
        assert rec.engine.enable_prefix_caching is True and rec.engine.model == "synthetic"
        latencies = rec.latencies()
        assert len(latencies) == 60 and latencies[5] == ("ttft", stats[5].timestamp, 0.05)


def test_finished_requests_steps_and_window(tmp_path):
    stats = session_stats(60)
    path = tmp_path / "s.kvrec"
    write_session(path, stats)
    with open_recording(path) as rec:
        finished = rec.finished_requests()
        # req-r lives snapshots 5r..5r+19: r = 0..7 vanish before the end.
        assert [f.request_id for f in finished] == [f"req-{r}" for r in (0, 1, 3, 4, 5, 6, 7, 2)]
        req2 = finished[-1]
        assert req2.source == "output" and req2.output_tokens == 17  # the final output wins
        req0 = finished[0]
        assert req0.source == "snapshot" and req0.finished_at == stats[20].timestamp
        assert req0.timeline is not None and req0.timeline.decode_runs
        assert req0.arrival_time == pytest.approx(T0)
        steps = rec.steps()
        numbers = [s.step for s in steps]
        assert numbers == sorted(set(numbers)) and numbers[0] == 1
        described = {s.step: s for s in steps if s.duration_s is not None}
        assert described[3 * 7].duration_s == stats[7].last_step_duration_s
        assert described[3 * 7].num_seqs == stats[7].last_step_num_seqs
        window = list(rec.snapshots(stats[10].timestamp, stats[12].timestamp))
        assert [s for _, s in window] == stats[10:13]


def test_a_newer_engines_fields_are_ignored(tmp_path):
    """Fields this kvdeck does not know (a newer engine's) are stored and skipped on reading."""
    stats = session_stats(12)
    path = tmp_path / "s.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO, keyframe_s=1.0, chunk_s=0.35)
    from kvdeck.app.record import format as fmt

    original = fmt.encoded_stats

    def with_extra(snapshot):
        data = original(snapshot)
        data["kv_host_tier_blocks"] = 7
        return data

    import kvdeck.app.record.writer as writer_module

    writer_module.encoded_stats, saved = with_extra, writer_module.encoded_stats
    try:
        for snapshot in stats:
            writer.add_stats(snapshot)
        writer.close()
    finally:
        writer_module.encoded_stats = saved
    with open_recording(path) as rec:
        assert all("kv_host_tier_blocks" in state for _, state in rec._stats_records(None, None))
        assert [s for _, s in rec.snapshots()] == stats


def test_the_stored_form_is_the_stats_streams():
    """encoded_stats builds stats_to_dict's dict (its own faster way), but for the two
    per-block lists, kept diffable."""
    from kvdeck.app.record.format import ORDER, encoded_stats
    from kvdeck.engine.types.stats import stats_to_dict

    for snapshot in session_stats(30)[::7]:
        stored = encoded_stats(snapshot)
        expected = stats_to_dict(snapshot)
        assert stored.pop("block_ref_counts") == snapshot.block_ref_counts
        expected.pop("block_ref_counts")
        assert stored.pop(ORDER) == [r.request_id for r in snapshot.requests]
        assert list(stored.pop("requests").values()) == expected.pop("requests")
        assert stored == expected


def test_a_listener_that_joins_late_numbers_steps_as_the_engine_does(tmp_path):
    """Steps the listener hears after the engine has run some (a server's recorder starts
    while the first requests run) keep the engine's numbers: none is written over."""
    stats = session_stats(30)
    path = tmp_path / "late.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO)
    for i, snapshot in enumerate(stats):
        writer.add_stats(snapshot)
        if i >= 10:  # steps 31.. heard, in uneven batches
            writer.add_steps(snapshot.timestamp, [1] * (1 + i % 2) + [2], 3 * i + 3)
    writer.close()
    with open_recording(path) as rec:
        steps = {s.step: s for s in rec.steps()}
    heard = {step for i in range(10, 30)
             for step in range(3 * i + 3 - (1 + i % 2), 3 * i + 4)}
    assert heard <= set(steps)
    # A snapshot's step is the listener's step of that number: its tokens, the snapshot's parts.
    for i in range(10, 29):
        step = steps[3 * i + 3]
        assert step.tokens == 2 and step.duration_s == stats[i + 1].last_step_duration_s
        assert steps[3 * i + 2].tokens == 1


def test_steps_keep_their_held_blocks_and_version_1_files_still_read(tmp_path):
    """A step record says the KV blocks held after it (the step listener's, else the snapshot's);
    a version 1 file's six-field step records read back with used_blocks None."""
    stats = session_stats(12)
    path = tmp_path / "held.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO)
    for i, snapshot in enumerate(stats):  # snapshot i follows step 3i, heard before it
        if i:
            writer.add_steps(snapshot.timestamp, [4, 5, 6], 3 * i, [100 + i, 200 + i, 300 + i])
        writer.add_stats(snapshot)
    end = stats[-1]  # the last snapshot, again after a step nobody heard: its pool says
    writer.add_stats(dataclasses.replace(end, timestamp=end.timestamp + 0.01,
                                         num_steps=end.num_steps + 1))
    with pytest.raises(ValueError, match="2 steps' tokens but 1 steps' used blocks"):
        writer.add_steps(stats[-1].timestamp, [4, 5], 99, [1])
    writer.close()
    with open_recording(path) as rec:
        held = {s.step: s.used_blocks for s in rec.steps()}
    assert held == {3 * i - 2 + k: 100 * (k + 1) + i for i in range(1, 12) for k in range(3)} | {
        34: end.num_blocks - end.num_free_blocks}

    db = sqlite3.connect(path)
    with db:
        for seq, data in db.execute("SELECT seq, data FROM chunks").fetchall():
            records = [[t, kind, payload[:6] if kind == STEP else payload]
                       for t, kind, payload in unpack_records(data)]
            db.execute("UPDATE chunks SET data = ? WHERE seq = ?", (pack_records(records), seq))
        db.execute("UPDATE meta SET value = '1' WHERE key = 'version'")
    db.close()
    with open_recording(path) as rec:
        steps = rec.steps()
    assert [s.step for s in steps] == list(range(1, 35)) and all(s.used_blocks is None for s in steps)
    assert [s.tokens for s in steps[:3]] == [4, 5, 6]
