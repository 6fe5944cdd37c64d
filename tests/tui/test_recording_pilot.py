"""Recording from the TUI: f7 starts and stops (the header says so while it runs), --record
starts at launch, and what was recorded is what the dashboard got."""

from __future__ import annotations

from kvdeck.app.record.reader import open_recording
from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.recording_control import REC_MARK
from tests.tui.conftest import FakeFactory, wait_for
from tests.tui.test_chat_pilot import send


async def test_f7_records_what_the_dashboard_shows(make_app, kvdeck_home):
    app, factory = make_app(token_delay=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        assert REC_MARK not in app.sub_title
        await pilot.press("f7")
        assert app.recording.active and REC_MARK in app.sub_title
        path = app.recording.path
        assert path is not None and path.parent == kvdeck_home / "recordings"
        await send(pilot, "hello engine")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: factory.client.sent and not chat.generating,
                              timeout=10)
        # Busy snapshots are sampled (SNAPSHOT_HZ) and one arriving before f7 lands may
        # replace a held one; idle ones are all stored, so the comparison waits for idle.
        state = app.dashboard_state
        assert await wait_for(pilot, lambda: state.stats is not None
                              and not state.stats.num_running and not state.stats.num_waiting,
                              timeout=10)
        shown = state.stats
        await pilot.press("f7")
        assert not app.recording.active and REC_MARK not in app.sub_title
        assert app.dashboard_state.recorder is None
    with open_recording(path) as rec:
        assert rec.complete and rec.engine.model == "fake-llama"
        snapshots = [s for _, s in rec.snapshots()]
        assert shown in snapshots  # the dashboard's last snapshot, exactly
        assert any(s.requests for s in snapshots)  # the reply's request, while it ran
        kinds = {kind for kind, _, _ in rec.latencies()}
        assert kinds == {"ttft", "itl"}  # the chat's own reply timings


async def test_record_flag_starts_at_launch_and_quitting_closes(tmp_path):
    path = tmp_path / "launch.kvrec"
    factory = FakeFactory()
    app = KvdeckApp(factory, model_name="fake-llama", transcript_dir=tmp_path / "chats",
                    record_to=path)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        assert app.recording.path == path and REC_MARK in app.sub_title
        assert await wait_for(pilot, lambda: len(app.dashboard_state.kv_history) > 3,
                              timeout=10)
    with open_recording(path) as rec:  # unmounting closed it: complete, one file
        assert rec.complete and len(rec.snapshot_times()) > 3
    assert not (tmp_path / "launch.kvrec-wal").exists()


async def test_f7_on_a_file_that_cannot_be_written_says_why(make_app, tmp_path):
    app, _ = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        taken = tmp_path / "taken.kvrec"
        taken.write_text("someone's file")
        app.action_toggle_recording(taken)
        await pilot.pause()
        assert not app.recording.active
        assert any("already exists" in n.message for n in app._notifications)
        assert taken.read_text() == "someone's file"
