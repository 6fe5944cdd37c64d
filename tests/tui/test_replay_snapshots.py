"""Pictures of `kvdeck replay` at chosen moments of a synthetic recording: the block map,
the graphs, the request table and the position bar as the recorded dashboard had them.

Regenerate after an intended change: pytest tests/tui/test_replay_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.writer import RecordingWriter
from kvdeck.tui.replay_app import ReplayApp
from tests.record.synthetic import ENGINE_INFO, session_stats

COUNT = 60


def recorded_app(tmp_path) -> ReplayApp:
    stats = session_stats(COUNT)
    path = tmp_path / "session.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO, chunk_s=0.35, keyframe_s=1.0)
    for i, snapshot in enumerate(stats):
        writer.add_stats(snapshot)
        if i % 3 == 0:  # a first token every third snapshot, the 9th the slowest
            writer.add_latency("ttft", snapshot.timestamp, 0.9 if i == 27 else 0.05)
    writer.close()
    app = ReplayApp(open_recording(path))
    app.animation_level = "none"
    return app


@pytest.fixture
def utc(monkeypatch):
    """The bar shows the recorded wall-clock time in the local zone: pictures taken in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("moment", [12, 45])
def test_replay_at_a_moment(snap_compare, tmp_path, utc, moment):
    async def run_before(pilot) -> None:
        app = pilot.app
        await pilot.pause()  # the replay screen mounted
        app.cursor.seek_index(moment)
        app.replay._moved()
        await pilot.pause()
        await pilot.pause(0.3)  # one dashboard refresh tick
        await pilot.pause()

    assert snap_compare(recorded_app(tmp_path), terminal_size=(160, 45), run_before=run_before)
