"""The engine settings (ctrl+e: speculative decoding, KV cache dtype) and the dashboard's
Speculation tab, which graphs acceptance from the snapshots' counters."""

from __future__ import annotations

import dataclasses

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Input, Select, Static

from kvdeck.assets import demo_model_dir
from kvdeck.engine.types.spec_stats import SpecDecodeStats
from kvdeck.engine.types.wire import EngineInfo
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.engine_settings import TUI_DEFAULT_SPECULATION, EngineSettings, speculation_choices
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
    # The TUI's default: suffix drafts under the gain policy, seven at most on this CPU.
    auto = EngineSettings.from_engine_options({"speculative_config": TUI_DEFAULT_SPECULATION})
    assert (auto.speculation, auto.num_speculative_tokens) == ("auto", 7)
    assert auto.apply({})["speculative_config"] == {"method": "auto", "num_speculative_tokens": 7}
    assert auto.describe().startswith("automatic speculation (suffix drafts where they pay)")


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


SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("model", [None, "demo", str(demo_model_dir())])
def test_the_demo_model_is_offered_its_bundled_draft(model):
    assert [value for _, value in speculation_choices(model)] \
        == ["off", "auto", "ngram", "suffix", "bundled:demo-draft", "draft_model"]


@pytest.mark.parametrize("model", [SMOLLM2, "/no/such/model"])
def test_another_model_is_not_offered_the_demo_draft(model):
    # n-gram, suffix and a draft of the user's own (checked when the engine loads it) stay
    assert [value for _, value in speculation_choices(model)] \
        == ["off", "auto", "ngram", "suffix", "draft_model"]


def test_the_bundled_choice_is_the_demo_draft_and_a_custom_draft_is_kept():
    bundled = EngineSettings.parse("bundled:demo-draft", "3", "ignored", "auto")
    assert (bundled.speculation, bundled.draft_model) == ("draft_model", "demo-draft")
    assert bundled.speculative_config() == {"model": "demo-draft", "num_speculative_tokens": 3}
    custom = EngineSettings.parse("draft_model", "3", " ~/models/my-draft ", "auto")
    assert custom.speculative_config() == {"model": "~/models/my-draft", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="unknown choice 'bundled:other-draft'"):
        EngineSettings.parse("bundled:other-draft", "3", "", "auto")


def engine_info(device: str, dtype: str) -> EngineInfo:
    return EngineInfo(model_dir="/m", max_model_len=512, vocab_size=4096, num_blocks=64,
                      block_size=16, device=device, dtype=dtype, kv_bytes_per_token=1024,
                      kv_cache_dtype=dtype, enable_prefix_caching=True,
                      weight_bytes_per_token=1 << 20, cuda_graphs=False)


class FormApp(App):
    def __init__(self, settings: EngineSettings, model: str | None, info: EngineInfo | None) -> None:
        super().__init__()
        self.form = EngineSettingsScreen(settings, model, info)

    def on_mount(self) -> None:
        self.push_screen(self.form)


def options(form: EngineSettingsScreen) -> list[str]:
    return [str(value) for _, value in form.query_one("#speculation", Select)._options]


async def test_the_form_offers_demo_draft_only_beside_the_demo_model():
    demo_draft = EngineSettings("draft_model", 3, "demo-draft")
    app = FormApp(demo_draft, None, None)
    async with app.run_test(size=(100, 30)) as pilot:
        form = app.form
        await pilot.pause()
        assert "bundled:demo-draft" in options(form)
        assert form.query_one("#speculation", Select).value == "bundled:demo-draft"
        draft = form.query_one("#draft-model", Input)
        assert draft.disabled and draft.value == ""  # the bundled draft is a choice of its own
        form.action_save()
        assert await wait_for(pilot, lambda: form.is_attached is False)
    app = FormApp(demo_draft, SMOLLM2, None)  # e.g. demo-draft given on the command line
    async with app.run_test(size=(100, 30)) as pilot:
        form = app.form
        await pilot.pause()
        assert options(form) == ["off", "auto", "ngram", "suffix", "draft_model"]
        # shown as the user's own draft: saving it lets the engine say why it does not fit
        assert form.query_one("#speculation", Select).value == "draft_model"
        draft = form.query_one("#draft-model", Input)
        assert not draft.disabled and draft.value == "demo-draft"
        form.query_one("#speculation", Select).value = "suffix"
        await pilot.pause()
        assert draft.disabled


def hint_text(form: EngineSettingsScreen) -> str:
    hint = form.query_one("#spec-exactness-hint", Static)
    return str(hint.render()) if hint.display else ""


async def test_the_hint_says_where_greedy_output_may_part_from_plain_decoding():
    app = FormApp(EngineSettings("ngram", 7), SMOLLM2, engine_info("cpu", "bfloat16"))
    async with app.run_test(size=(100, 30)) as pilot:
        form = app.form
        await pilot.pause()
        assert hint_text(form) == ""  # seven drafts: a verify of 8 rows, plain greedy's bits
        k = form.query_one("#num-speculative-tokens", Input)
        k.value = "8"
        await pilot.pause()
        assert "k > 7 on a bf16 CPU" in hint_text(form)
        assert "last bits" in hint_text(form)
        form.query_one("#speculation", Select).value = "off"
        await pilot.pause()
        assert hint_text(form) == ""  # nothing verified
        form.query_one("#speculation", Select).value = "suffix"
        await pilot.pause()
        assert "k > 7" in hint_text(form)
        k.value = "7"
        await pilot.pause()
        assert hint_text(form) == ""
    for info in (engine_info("cpu", "float32"), engine_info("cuda:0", "bfloat16"), None):
        app = FormApp(EngineSettings("ngram", 12), SMOLLM2, info)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            assert hint_text(app.form) == "", info  # only said of a bf16 CPU engine


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
        assert "bundled:demo-draft" in options(form)  # the app runs the demo model (model=None)
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
        policy = dashboard.query_one("#spec-policy", Static)
        assert "every one verified" in str(policy.render())
        gain = SpecDecodeStats("auto", 7, 16, num_drafts=60, num_draft_tokens=240,
                               num_accepted_tokens=180, draft_policy="gain",
                               last_step_expected_speedup=1.8, extra_row_cost=0.125)
        state.add_stats(dataclasses.replace(demo_stats(6), spec=gain))
        assert await wait_for(pilot, lambda: "expecting 1.80x" in str(policy.render()))
        assert "extra row costs +12%" in str(policy.render())


def test_the_inspector_says_what_the_gain_policy_decided():
    from kvdeck.engine.types.spec_stats import RequestSpecStats
    from kvdeck.tui.widgets.request_inspector import speculation_text

    spec = RequestSpecStats(num_drafts=3, num_draft_tokens=9, num_accepted_tokens=6,
                            decision="verifying 2 of 5 drafts: expects 1.4 accepted")
    assert "policy: verifying 2 of 5 drafts: expects 1.4 accepted" in speculation_text(spec).plain
    assert "policy:" not in speculation_text(RequestSpecStats(num_drafts=1)).plain
