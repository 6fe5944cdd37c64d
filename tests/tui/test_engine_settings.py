"""The engine settings (ctrl+e: speculative decoding, KV cache dtype) and the dashboard's
Speculation tab, which graphs acceptance from the snapshots' counters."""

from __future__ import annotations

import dataclasses

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Input, Select, Static

from kvdeck.engine.types.spec_stats import SpecDecodeStats
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.engine_settings import EngineSettings
from kvdeck.tui.screens.engine_settings import EngineSettingsScreen
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.latency_plot import TimeSeriesPlot
from tests.tui.conftest import FakeFactory, wait_for
from tests.tui.demo_stats import demo_stats


def test_settings_round_trip_through_the_engine_options():
    options = {"max_model_len": 2048, "speculative_config": {"model": "demo-draft",
                                                             "num_speculative_tokens": 3}}
    settings = EngineSettings.from_engine_options(options)
    assert (settings.speculation, settings.num_speculative_tokens, settings.draft_model) \
        == ("draft_model", 3, "demo-draft")
    ngram = EngineSettings.parse("ngram", "5", "", "int8")
    applied = ngram.apply(options)
    assert applied == {"max_model_len": 2048, "kv_cache_dtype": "int8",
                       "speculative_config": {"method": "ngram", "num_speculative_tokens": 5,
                                              "prompt_lookup_min": 2, "prompt_lookup_max": 5}}
    assert EngineSettings.from_engine_options(applied) == ngram
    assert EngineSettings.parse("off", "4", "", "auto").apply(applied) == {"max_model_len": 2048}
    suffix = EngineSettings.parse("suffix", "12", "", "auto")
    assert suffix.apply(options)["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 12}
    assert EngineSettings.from_engine_options(suffix.apply(options)) == suffix
    assert suffix.describe().startswith("suffix decoding, up to k=12")


@pytest.mark.parametrize(("fields", "message"), [
    (("ngram", "0", "", "auto"), r"speculative tokens must be in \[1, 16\], got 0"),
    (("ngram", "four", "", "auto"), "speculative tokens must be a whole number, got 'four'"),
    (("draft_model", "3", "  ", "auto"), "a draft model needs a folder or hub id"),
    (("off", "4", "", "fp4"), "KV cache dtype must be one of .*got 'fp4'"),
    (("medusa", "4", "", "auto"), "unknown choice 'medusa'"),
])
def test_bad_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings.parse(*fields)


def test_acceptance_is_computed_between_snapshots():
    state = DashboardState()
    counters = [(0, 0, 0), (10, 40, 20), (10, 40, 20), (14, 56, 32), (2, 8, 8)]
    for step, (drafts, drafted, accepted) in enumerate(counters):
        spec = SpecDecodeStats("ngram", 4, 16, num_drafts=drafts, num_draft_tokens=drafted,
                               num_accepted_tokens=accepted)
        state.add_stats(dataclasses.replace(demo_stats(step), spec=spec))
    # 20 of 40 drafted tokens in 10 steps, then nothing verified, then 12 of 16 in 4 steps;
    # the last snapshot's counters went back (a restarted engine): no point.
    assert [v for _, v in state.acceptance_history] == [0.5, 0.75]
    assert [v for _, v in state.accepted_per_step_history] == [2.0, 3.0]
    state.reset()
    assert not state.acceptance_history and not state.accepted_per_step_history


async def test_ctrl_e_restarts_the_engine_with_speculation(tmp_path):
    from kvdeck.tui.app import KvdeckApp

    made: list[tuple[str | None, dict]] = []

    def factory_for_model(name: str | None, options: dict) -> FakeFactory:
        made.append((name, options))
        return FakeFactory()

    app = KvdeckApp(FakeFactory(), model_name="fake-llama", transcript_dir=tmp_path,
                    factory_for_model=factory_for_model, engine_options={"max_model_len": 512})
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        first = app.engine.client
        await pilot.press("ctrl+e")
        assert await wait_for(pilot, lambda: isinstance(app.screen, EngineSettingsScreen))
        form = app.screen
        assert form.query_one("#draft-model", Input).disabled  # speculation is off
        form.query_one("#speculation", Select).value = "ngram"
        form.query_one("#num-speculative-tokens", Input).value = "0"
        form.action_save()
        await pilot.pause()
        assert "[1, 16], got 0" in str(form.query_one("#engine-settings-error", Static).render())
        assert not made  # nothing restarted for a refused form
        form.query_one("#num-speculative-tokens", Input).value = "3"
        form.action_save()
        assert await wait_for(pilot, lambda: app.engine_ready and app.engine.client is not first)
        assert made == [(None, {"max_model_len": 512, "speculative_config": {
            "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}})]
        assert app.engine_options == made[0][1]
        await pilot.press("ctrl+e")  # the form opens on what runs now
        assert await wait_for(pilot, lambda: isinstance(app.screen, EngineSettingsScreen))
        assert app.screen.query_one("#speculation", Select).value == "ngram"
        assert app.screen.query_one("#num-speculative-tokens", Input).value == "3"


class DashboardApp(App):
    def __init__(self, state: DashboardState) -> None:
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        yield Dashboard(self.state)


async def test_speculation_tab_graphs_acceptance_or_says_it_is_off():
    state = DashboardState()
    app = DashboardApp(state)
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = app.query_one(Dashboard)
        state.add_stats(demo_stats(0))
        dashboard.show_tab("tab-spec")
        await pilot.pause(0.2)
        assert not dashboard.has_class("-speculating")
        assert "Speculative decoding is off" in str(dashboard.query_one("#spec-off", Static).render())
        for step in range(1, 6):
            spec = SpecDecodeStats("ngram", 4, 16, num_drafts=10 * step,
                                   num_draft_tokens=40 * step, num_accepted_tokens=30 * step)
            state.add_stats(dataclasses.replace(demo_stats(step), spec=spec))
        await pilot.pause(0.8)  # a refresh tick and the plots' slower cadence
        assert dashboard.has_class("-speculating")
        acceptance = dashboard.query_one("#plot-acceptance", TimeSeriesPlot)
        per_step = dashboard.query_one("#plot-accepted-per-step", TimeSeriesPlot)
        assert await wait_for(pilot, lambda: len(acceptance._points) == 4)
        assert {round(v, 6) for _, v in acceptance._points} == {75.0}
        assert {round(v, 6) for _, v in per_step._points} == {3.0}
