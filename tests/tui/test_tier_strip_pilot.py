"""The block map's second strip (the KV tiers behind the device pool) and the inspector's line
on a request's tiers and swaps, driven with the Pilot from hand-made snapshots."""

from __future__ import annotations

from textual.app import App, ComposeResult

from kvdeck.engine.types.request_timeline import TimelineSnapshot
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.tier_cells import bar_cells, request_tiers_text, tier_rows
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.engine_summary import queue_line
from kvdeck.tui.widgets.tier_strip import BAR_WIDTH, TierStrip, tier_strip_text
from tests.tui.conftest import wait_for
from tests.tui.demo_stats import demo_stats


class DashboardApp(App):
    def __init__(self, state: DashboardState) -> None:
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        yield Dashboard(self.state)


def _with_tiers(step: int):
    stats = demo_stats(step)
    stats.host_swap_blocks_total, stats.host_swap_blocks_used = 200, 50
    stats.num_swapped, stats.swap_outs_total, stats.swap_ins_total = 2, 7, 5
    stats.swap_seconds_total = 0.012
    stats.host_cache_blocks_total, stats.host_cache_blocks = 1000, 10
    stats.host_cache_queries, stats.host_cache_hits = 400, 100
    return stats


async def test_the_strip_shows_each_configured_tier_and_hides_without_any():
    state = DashboardState()
    app = DashboardApp(state)
    async with app.run_test(size=(160, 48)) as pilot:
        strip = app.query_one(TierStrip)
        state.add_stats(demo_stats(0))
        assert await wait_for(pilot, lambda: app.query_one(Dashboard).redraws >= 1)
        assert not strip.display  # no tier configured: no strip
        state.add_stats(_with_tiers(1))
        assert await wait_for(pilot, lambda: strip.display)
        # Shown takes a layout pass to get its place (and its width, which its lines fill).
        assert await wait_for(pilot, lambda: strip.region.height == 2 and strip.region.width > 0)
        lines = str(strip.render()).splitlines()
        assert len(lines) == 2  # no disk tier configured: no disk row
        assert lines[0].startswith("host swap") and "50 / 200 blocks" in lines[0]
        assert "2 swapped out · 7 out, 5 in (12 ms of copies)" in lines[0]
        assert lines[1].startswith("host cache") and "10 / 1,000 blocks" in lines[1]
        assert "hit rate 25% (100 of 400 prompt tokens)" in lines[1]


async def test_a_narrow_strip_breaks_between_figures_under_the_bar():
    state = DashboardState()
    app = DashboardApp(state)
    async with app.run_test(size=(60, 40)) as pilot:
        strip = app.query_one(TierStrip)
        state.add_stats(_with_tiers(1))
        assert await wait_for(pilot, lambda: strip.display and strip.region.width > 0
                              and strip.region.height > 2)
        lines = str(strip.render()).splitlines()
        assert strip.region.height == len(lines)  # laid out as tall as it draws
        assert lines == [
            "host swap  " + "█" * 5 + "·" * 15 + " 50 / 200 blocks",
            " " * 11 + "2 swapped out · 7 out, 5 in (12 ms of copies)",
            "host cache " + "█" + "·" * 19 + " 10 / 1,000 blocks",
            " " * 11 + "hit rate 25% (100 of 400 prompt tokens)"]


def test_bars_fill_by_use_and_show_any_use():
    rows = tier_rows(_with_tiers(0))
    assert [bar_cells(row, 24) for row in rows] == [6, 1]  # a quarter; 1% still shows
    stats = _with_tiers(0)
    stats.disk_cache_blocks_total, stats.disk_cache_blocks = 64, 64
    assert tier_strip_text(stats).plain.splitlines()[2].startswith("disk cache " + "█" * BAR_WIDTH)


def test_the_inspector_says_where_the_prompt_came_from_and_what_swaps_cost():
    request = demo_stats(0).requests[0]
    assert request_tiers_text(request).plain == ""
    request.num_cached_tokens, request.num_host_cached_tokens, request.num_disk_cached_tokens = 32, 64, 16
    request.timeline = TimelineSnapshot(queued_at=0.0, taken_at=1.0,
                                        swaps=[(3, 3 << 20, 0.002), (9, 1 << 20, 0.0015)])
    text = request_tiers_text(request).plain
    assert "prompt from cache: device 32 · host 64 · disk 16 tok" in text
    assert "swapped twice: 4.0 MiB out and back, 3.5 ms of copies" in text


def test_the_queue_line_counts_swapped_requests_only_when_there_are_some():
    state = DashboardState()
    state.add_stats(_with_tiers(0))
    assert "swapped 2  preemptions" in queue_line(state).plain
    state.add_stats(demo_stats(1))
    assert "swapped" not in queue_line(state).plain
