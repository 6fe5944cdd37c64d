"""A busy engine's snapshots are stored SessionRecorder.snapshot_hz times a second at most;
the others still give their step records and the requests that left, idle ones are all
stored, and the last one seen ends the recording."""

from __future__ import annotations

import dataclasses

import pytest

from kvdeck.app.record.format import RecordingError
from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.session import SessionRecorder
from tests.record.synthetic import DT, session_stats


def test_busy_snapshots_are_thinned_but_steps_and_leavers_are_kept(tmp_path):
    stats = session_stats(60)  # DT = 0.1 s apart: 10 a second
    idle_at = stats[-1].timestamp + 0.05
    idle = dataclasses.replace(stats[-1], timestamp=idle_at, num_running=0, num_waiting=0,
                               requests=[], num_steps=stats[-1].num_steps + 1)
    recorder = SessionRecorder(tmp_path / "s.kvrec", snapshot_hz=1 / (3.5 * DT))
    for snapshot in stats:
        recorder.on_stats(snapshot)
    recorder.on_stats(idle)  # 0.05 s after the last: idle, stored all the same
    recorder.close()
    with open_recording(tmp_path / "s.kvrec") as rec:
        stored = [stats_ for _, stats_ in rec.snapshots()]
        steps = {s.step: s for s in rec.steps()}
        finished = {r.request_id for r in rec.finished_requests()}
    # Every 4th busy snapshot (0.35 s apart at least), each exactly as it was, then the idle one.
    assert stored == stats[::4] + [idle]
    # Each snapshot's step, stored or not, with its duration and the blocks held after it.
    for snapshot in stats[1:]:
        step = steps[snapshot.num_steps]
        assert step.duration_s == snapshot.last_step_duration_s
        assert step.used_blocks == snapshot.num_blocks - snapshot.num_free_blocks
    # Every request that left, though most left between two stored snapshots.
    assert finished == {r.request_id for s in stats for r in s.requests}


def test_a_burst_after_idle_is_stored_however_short(tmp_path):
    """An idle engine, then a burst shorter than the interval, then idle again: the burst's
    first snapshot is stored (replay shows it), the rest of it thinned."""
    busy = session_stats(8)[1:6]  # requests running in each
    t = busy[0].timestamp
    idle = [dataclasses.replace(busy[0], timestamp=t - 0.2, num_running=0, num_waiting=0,
                                requests=[]),
            dataclasses.replace(busy[0], timestamp=busy[-1].timestamp + 0.1, num_running=0,
                                num_waiting=0, requests=[])]
    recorder = SessionRecorder(tmp_path / "s.kvrec", snapshot_hz=1.0)
    for snapshot in [idle[0], *busy, idle[1]]:
        recorder.on_stats(snapshot)
    recorder.close()
    with open_recording(tmp_path / "s.kvrec") as rec:
        assert [s for _, s in rec.snapshots()] == [idle[0], busy[0], idle[1]]


def test_the_last_snapshot_seen_ends_the_recording(tmp_path):
    stats = session_stats(10)
    recorder = SessionRecorder(tmp_path / "s.kvrec", snapshot_hz=1.0)
    for snapshot in stats:
        recorder.on_stats(snapshot)
    recorder.close()
    with open_recording(tmp_path / "s.kvrec") as rec:
        assert [s for _, s in rec.snapshots()] == [stats[0], stats[-1]]


def test_a_rate_of_zero_is_refused(tmp_path):
    with pytest.raises(RecordingError, match="snapshots a second must be above 0, got 0"):
        SessionRecorder(tmp_path / "s.kvrec", snapshot_hz=0)
