"""`kvdeck replay`: the recorded dashboard comes back at every moment, and the keys move it."""

from __future__ import annotations

import pytest

from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.writer import RecordingWriter
from kvdeck.tui.block_cells import classify_blocks
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.replay_app import ReplayApp
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.replay_bar import ReplayBar
from kvdeck.tui.widgets.request_inspector import RequestInspector
from tests.record.synthetic import DT, ENGINE_INFO, session_stats
from tests.tui.conftest import wait_for

COUNT = 60


@pytest.fixture
def recorded(tmp_path):
    """A synthetic session, and the dashboards a live app had at each of its snapshots."""
    stats = session_stats(COUNT)
    path = tmp_path / "session.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO, chunk_s=0.35, keyframe_s=1.0)
    live = DashboardState(latency_feed=True, source="kvdeck")
    moments = []
    for i, snapshot in enumerate(stats):
        writer.add_stats(snapshot)
        live.add_stats(snapshot)
        if i % 3 == 0:  # a first token every third snapshot, the 9th the slowest
            ttft = 0.9 if i == 27 else 0.05
            writer.add_latency("ttft", snapshot.timestamp, ttft)
            live.add_feed_latency("ttft", snapshot.timestamp, ttft)
        moments.append((list(live.kv_history), list(live.throughput_history),
                        list(live.ttft_points)))
    writer.close()
    return path, stats, moments


def _shown(app: ReplayApp) -> tuple:
    state = app.dashboard_state
    return list(state.kv_history), list(state.throughput_history), list(state.ttft_points)


def _table_ids(app: ReplayApp) -> set[str]:
    table = app.query_one(RequestInspector).table
    return {key.value for key in table.rows}


async def test_replay_shows_each_recorded_moment(recorded):
    path, stats, moments = recorded
    app = ReplayApp(open_recording(path))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        for i in (0, 37, 12, 59, 30):  # forwards and back: rebuilt or advanced, the same
            app.cursor.seek_index(i)
            app.replay._moved()
            await pilot.pause()
            assert app.dashboard_state.stats == stats[i]
            assert _shown(app) == moments[i]
            block_map = app.query_one(BlockMap)
            assert block_map.cells == classify_blocks(stats[i])  # the map as drawn live
            live_ids = {r.request_id for r in stats[i].requests}
            assert live_ids <= _table_ids(app)
            # Finished ones listed are exactly those gone by then (the inspector's last six).
            gone = _table_ids(app) - live_ids
            seen_before = {r.request_id for s in stats[:i] for r in s.requests}
            assert gone <= seen_before - live_ids
        # The position bar says where: time into the recording and the engine's step.
        bar = str(app.query_one(ReplayBar).render())
        assert f"step {stats[30].num_steps}" in bar and "00:03.0 / 00:05.9" in bar


async def test_replay_keys_move_the_position(recorded):
    path, stats, _ = recorded
    app = ReplayApp(open_recording(path))
    async with app.run_test(size=(160, 45)) as pilot:
        cursor = app.cursor
        assert cursor.index == 0
        await pilot.press("right", "right")
        assert cursor.index == 2 and app.dashboard_state.stats == stats[2]
        await pilot.press("left")
        assert cursor.index == 1
        await pilot.press("shift+right")  # one second: ten snapshots DT apart
        assert cursor.index == 1 + round(1 / DT)
        await pilot.press("full_stop")  # the same, without shift
        assert cursor.index == 1 + round(2 / DT)
        await pilot.press("comma")
        assert cursor.index == 1 + round(1 / DT)
        await pilot.press("end")
        assert cursor.index == COUNT - 1
        await pilot.press("home")
        assert cursor.index == 0
        await pilot.press("w")  # the slowest first token came at snapshot 27
        assert cursor.index == 27 and app.dashboard_state.stats == stats[27]
        await pilot.press("plus", "plus", "plus", "plus")  # 16x: the 6 s play in < 1 s
        assert cursor.speed == 16
        await pilot.press("space")
        # Playing, or (a loaded machine, 16x) already played from snapshot 27 to the end.
        assert cursor.playing or cursor.at_end
        assert await wait_for(pilot, lambda: cursor.at_end and not cursor.playing, timeout=5)
        assert app.dashboard_state.stats == stats[-1]
        await pilot.press("minus")
        assert cursor.speed == 8


async def test_worst_ttft_selects_its_request(tmp_path):
    """With finished requests' timelines recorded, `w` shows the slowest one's request."""
    stats = session_stats(COUNT)
    path = tmp_path / "s.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO, chunk_s=0.35, keyframe_s=1.0)
    for snapshot in stats:
        writer.add_stats(snapshot)
    writer.close()
    app = ReplayApp(open_recording(path))
    async with app.run_test(size=(160, 45)) as pilot:
        worst = app.cursor.worst_ttft()
        assert worst is not None and worst.request_id is not None
        await pilot.press("w")
        await pilot.pause()
        assert app.query_one(RequestInspector).selected_id == worst.request_id
        assert app.cursor.t <= worst.at < app.cursor.t + DT
