"""`kvdeck --serve --record FILE` on the tiny model: the file holds the session (snapshots,
each finished request's timeline from its final output, latencies, steps, the engine's
limits) and `kvdeck replay` opens it on the moment the requests ran."""

from __future__ import annotations

import httpx
import pytest

from kvdeck.app.record.reader import open_recording
from kvdeck.tui.replay_app import ReplayApp
from kvdeck.tui.widgets.request_inspector import RequestInspector
from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(120)


# Long enough that the engine's stats (about 15 a second) see each request running: at 24
# tokens a request could finish between two snapshots and leave no busy moment to replay.
OUTPUT_TOKENS = 96


async def test_a_served_session_records_and_replays(serve_model_dir, tmp_path):
    path = tmp_path / "served.kvrec"
    server = start_server(serve_model_dir, tmp_path, "--record", str(path), "--max-num-seqs", "4")
    try:
        for n in range(3):
            body = {"prompt": f"hello {n}", "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
            reply = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
            assert reply.status_code == 200
        assert path.exists()  # written while it runs
        # An attached dashboard's recording learns the scheduler's limits from the info.
        info = httpx.get(f"{server.base_url}/kvdeck/v1/info", timeout=5).json()
        assert info["max_num_seqs"] == 4 and info["max_num_batched_tokens"] == 2048
    finally:
        stop_server(server)
    with open_recording(path) as rec:
        assert rec.complete  # a SIGTERM closes it: one file, its end marked
        assert rec.engine.max_num_seqs == 4 and rec.engine.block_size == 16
        assert rec.engine.max_num_batched_tokens == 2048 and rec.engine.num_blocks > 0
        finished = [r for r in rec.finished_requests() if r.source == "output"]
        assert len(finished) == 3
        assert all(r.output_tokens == OUTPUT_TOKENS and r.timeline is not None and r.timeline.ttft
                   for r in finished)
        assert sum(1 for kind, _, _ in rec.latencies() if kind == "ttft") == 3
        steps = rec.steps()
        assert sum(s.tokens for s in steps) >= 3 * OUTPUT_TOKENS  # every step's tokens, from the listener
        # and the blocks held after each (the engine loop's, through the client's listener)
        assert all(s.used_blocks is not None for s in steps)
        assert 0 < max(s.used_blocks for s in steps) <= rec.engine.num_blocks
        busy = [t for t, s in rec.snapshots() if s.num_running]
        assert busy
        ready = rec
        app = ReplayApp(ready)
        async with app.run_test(size=(160, 45)) as pilot:
            app.cursor.seek(busy[0])
            app.replay._moved()
            await pilot.pause()
            stats = app.dashboard_state.stats
            assert stats is not None and stats.num_running
            table = app.query_one(RequestInspector).table
            assert {r.request_id for r in stats.requests} <= {k.value for k in table.rows}
