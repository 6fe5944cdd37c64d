"""The dashboard driven with the Pilot against the fake engine client."""

from __future__ import annotations

import asyncio
import gc
import time

from textual.widgets import DataTable, Input

from kvdeck.tui.block_cells import SHARED
from kvdeck.tui.screens.load_generator import LoadGeneratorScreen
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.request_inspector import RequestInspector
from tests.tui.conftest import load_requests_in_flight, wait_for


async def fire_load(pilot, **values: int) -> None:
    app = pilot.app
    await pilot.press("ctrl+l")
    assert await wait_for(pilot, lambda: isinstance(app.screen, LoadGeneratorScreen))
    for name, value in values.items():
        app.screen.query_one(f"#{name}", Input).value = str(value)
    app.screen.action_fire()


async def test_load_generator_running_and_kv_rise_then_fall_to_zero(make_app):
    app, factory = make_app(token_delay=0.02, num_blocks=128)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, num_requests=6, prompt_tokens=40, output_tokens=20,
                        shared_prefix_tokens=32)
        state = app.dashboard_state
        peak = {"running": 0, "kv": 0.0}

        def rose() -> bool:
            if state.stats is not None:
                peak["running"] = max(peak["running"], state.stats.num_running)
                peak["kv"] = max(peak["kv"], state.stats.kv_cache_usage)
            return peak["running"] >= 2
        assert await wait_for(pilot, rose)
        assert peak["kv"] > 0
        # The shared 32-token prefix is two full blocks: later requests reuse them.
        assert await wait_for(pilot, lambda: state.stats.prefix_cache_hits > 0)
        assert await wait_for(pilot, lambda: not app.load.running, timeout=15)
        assert await wait_for(pilot, lambda: state.stats.num_running == 0
                              and state.stats.kv_cache_usage == 0.0)
        assert state.stats.num_requests_finished == 6
        assert state.tokens_per_s >= 0 and len(state.ttft_points) == 6
        block_map = app.screen.query_one(BlockMap)
        assert await wait_for(pilot, lambda: all(o is None for o in block_map.cells.owners))


async def test_load_generator_rejects_bad_values_and_can_be_stopped(make_app):
    app, factory = make_app(token_delay=0.05, num_blocks=256, max_model_len=256)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, prompt_tokens=200, output_tokens=100)
        await pilot.pause()
        error = str(app.screen.query_one("#load-error").render())
        assert "max_model_len (256)" in error
        app.screen.query_one("#output_tokens", Input).value = "50"
        app.screen.query_one("#num_requests", Input).value = "3"
        app.screen.action_fire()
        assert await wait_for(pilot, lambda: app.load.running)
        # In a narrow terminal firing the load switches to the dashboard.
        assert app.screen.has_class("-show-dashboard")
        assert await wait_for(pilot, lambda: load_requests_in_flight(factory.client) == 3)
        await pilot.press("ctrl+l")  # again: stops the burst
        assert await wait_for(pilot, lambda: not app.load.running)
        assert len(factory.client.aborted_ids) == 3
        assert await wait_for(pilot, lambda: app.dashboard_state.stats.num_running == 0)


async def test_inspector_shows_the_selected_requests_block_table(make_app):
    # Slow tokens: the block tables hold still while the test compares them.
    app, factory = make_app(token_delay=3.0, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, num_requests=3, prompt_tokens=64, output_tokens=60,
                        shared_prefix_tokens=16)
        inspector = app.screen.query_one(RequestInspector)
        table = inspector.query_one(DataTable)
        assert await wait_for(pilot, lambda: table.row_count == 3)
        table.focus()
        await pilot.press("down")  # highlight the second request
        assert await wait_for(pilot, lambda: inspector.selected_id is not None)
        selected = inspector.selected_id
        block_map = app.screen.query_one(BlockMap)
        assert block_map.selected_request == selected
        engine_table = {r.request_id: r.block_table
                        for r in factory.client.snapshot().requests}[selected]
        assert len(engine_table) == 4  # 64 prompt tokens / 16 per block
        detail = str(inspector.query_one("#request-detail").render())
        expected = "  ".join(f"{i}→{b}" for i, b in enumerate(engine_table))
        assert expected in detail
        current = engine_table
        # Its blocks are drawn at full colour; the other requests' blocks are muted.
        owned = [b for b, o in enumerate(block_map.cells.owners) if o == selected]
        assert owned and all(b in current for b in owned)
        # Clicking a block of another request selects that request.
        other = next(o for o in block_map.cells.owners if o and o != selected)
        block = block_map.cells.owners.index(other)
        per_row, cell = block_map._columns, block_map._cell_width
        await pilot.click(BlockMap, offset=(block % per_row * cell, block // per_row))
        assert await wait_for(pilot, lambda: inspector.selected_id == other)
        await app.load.stop()


async def test_dashboard_redraws_at_least_ten_times_a_second(make_app):
    app, factory = make_app(token_delay=0.02, stats_interval=0.02)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        dashboard = app.screen.query_one(Dashboard)
        # What the suite allocated before must not stall this loop: a full collection
        # over it takes longer than a frame once hundreds of tests have run.
        gc.collect()
        gc.freeze()
        try:
            start_count, start = dashboard.redraws, time.monotonic()
            await pilot.pause(3.0)
            rate = (dashboard.redraws - start_count) / (time.monotonic() - start)
        finally:
            gc.unfreeze()
        assert rate >= 8, f"dashboard redrew {rate:.1f} times/s (timer is 12/s)"


async def test_narrow_terminal_switches_panes_and_tabs(make_app):
    app, factory = make_app(frozen_stats=None)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        screen = app.screen
        assert screen.has_class("-narrow")
        assert screen.query_one("#chat").display and not screen.query_one("#dashboard").display
        await pilot.press("f2")
        assert not screen.query_one("#chat").display and screen.query_one("#dashboard").display
        await pilot.press("f3")
        assert screen.query_one("#dashboard-tabs").active == "tab-latency"
        await pilot.press("f2")
        assert screen.query_one("#chat").display
        await pilot.press("ctrl+t")
        assert app.theme == "textual-light"
        await pilot.press("ctrl+t")
        assert app.theme == "textual-dark"


async def test_first_burst_shares_its_prefix_and_each_burst_draws_fresh_prompts(make_app):
    # Slow steps: the followers are still running when the test looks at the map.
    app, factory = make_app(token_delay=0.1, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, num_requests=5, prompt_tokens=48, output_tokens=8,
                        shared_prefix_tokens=32, seed="")
        block_map = app.screen.query_one(BlockMap)
        # The leader's two full prefix blocks are cached before the others are sent, so
        # the first burst already shows them shared (ref count 5) on the map.
        assert await wait_for(pilot, lambda: block_map.cells is not None
                              and block_map.cells.kinds.count(SHARED) == 2, timeout=10)
        assert max(block_map.cells.ref_counts) == 5
        assert await wait_for(pilot, lambda: not app.activity.is_running("load"), timeout=15)
        first = [p[:32] for p in factory.client.prompts]
        await fire_load(pilot, num_requests=5, prompt_tokens=48, output_tokens=8,
                        shared_prefix_tokens=32, seed="")
        assert await wait_for(pilot, lambda: len(factory.client.prompts) == 10)
        assert factory.client.prompts[5][:32] != first[0]  # a new seed: new prompts
        assert await wait_for(pilot, lambda: not app.activity.is_running("load"), timeout=15)


async def test_without_a_leader_a_burst_admitted_at_once_shares_nothing(make_app):
    """What the engine does (and the fake copies): a block is shared only once computed."""
    from kvdeck.tui.load_generator import LoadGenerator, LoadSpec

    app, factory = make_app(token_delay=0.05, num_blocks=256)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        client = factory.client
        spec = LoadSpec(num_requests=4, prompt_tokens=48, output_tokens=4,
                        shared_prefix_tokens=0, seed=3)
        prompts = [[7] * 32 + [i + 10] * 16 for i in range(4)]  # a common 32-token prefix
        outs = [client.generate(p, _params(), request_id=f"r{i}") for i, p in enumerate(prompts)]
        await asyncio.gather(*(anext(o) for o in outs))
        assert max(client.ref_counts) == 1  # admitted together: nothing shared
        for out in outs:
            await out.aclose()
        result = await LoadGenerator(client).run(spec)
        assert result.completed == 4 and result.seed == 3


def _params():
    from kvdeck.engine.types.sampling_params import SamplingParams

    return SamplingParams(max_tokens=4, ignore_eos=True)


async def test_inspector_keeps_finished_requests_dimmed_and_graphs_share_a_window(make_app):
    app, factory = make_app(token_delay=0.02, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, num_requests=8, prompt_tokens=32, output_tokens=6,
                        shared_prefix_tokens=0)
        inspector = app.screen.query_one(RequestInspector)
        table = inspector.query_one(DataTable)
        assert await wait_for(pilot, lambda: not app.activity.is_running("load"), timeout=15)
        assert await wait_for(pilot, lambda: app.dashboard_state.stats.num_running == 0)

        def states() -> list[str]:
            return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
        # The last six are kept (dimmed) after they ended; the map redraws on its timer.
        assert await wait_for(pilot, lambda: states() == ["finished"] * 6)
        table.focus()
        await pilot.press("down")
        assert await wait_for(pilot, lambda: inspector.selected_id is not None)
        detail = str(inspector.query_one("#request-detail").render())
        assert "finished: its blocks were freed" in detail and "logical→physical" in detail
        assert "idle" in str(app.screen.query_one("#throughput").render())
        await pilot.press("f3")
        await pilot.pause(0.6)
        plots = [app.screen.query_one(f"#plot-{n}") for n in ("ttft", "itl", "throughput", "kv")]
        assert all(p._points and max(x for x, _ in p._points) <= 0 for p in plots)
        assert all(min(x for x, _ in p._points) >= -60 for p in plots)


async def test_finished_requests_show_their_final_counts_not_their_last_snapshots(make_app):
    """Snapshots come every 0.4 s and a request writes its 6 tokens in about 0.15 s: the
    last snapshot a request was in (if any) predates its end. The final outputs set its
    row, and a request no snapshot saw is listed too."""
    app, factory = make_app(token_delay=0.02, stats_interval=0.4, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await fire_load(pilot, num_requests=5, prompt_tokens=24, output_tokens=6,
                        shared_prefix_tokens=0)
        inspector = app.screen.query_one(RequestInspector)
        table = inspector.query_one(DataTable)
        client = factory.client
        assert await wait_for(pilot, lambda: client.counters["finished"] == 5, timeout=15)

        def rows() -> list[tuple[str, ...]]:
            return [tuple(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count)]
        # state, prompt, computed, output per row: every request, finished, with all 6 tokens.
        prompts = [prompt for prompt, _ in client.sent]
        expected = sorted(("finished", str(p), str(p + 5), "6") for p in prompts)
        assert await wait_for(pilot, lambda: sorted(r[1:5] for r in rows()) == expected,
                              timeout=5), rows()
