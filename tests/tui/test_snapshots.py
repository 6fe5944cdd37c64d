"""Pictures of the main, help, engine-settings, error and Models screens and the quantise dialog at
80x24 and 160x48 (fake, fixed stats; the dialog at 100x30).

Regenerate after an intended change: pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest
from textual.widgets.data_table import ColumnKey

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.engine_settings import EngineSettings
from kvdeck.tui.screens.engine_error import EngineErrorScreen
from kvdeck.tui.screens.engine_settings import EngineSettingsScreen
from kvdeck.tui.screens.help import HelpScreen
from kvdeck.tui.transcripts import ChatTurn, Transcript
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.request_table import RequestTable
from tests.tui.conftest import FakeFactory, wait_for
from tests.tui.demo_stats import demo_latencies, demo_stats_series

SIZES = [(80, 24), (160, 48)]
SNAPSHOTS = 20


def demo_transcript() -> Transcript:
    return Transcript(id="demo", created="2026-01-01T00:00:00+00:00", model="fake-llama",
                      turns=[
                          ChatTurn("user", "What is a KV block?"),
                          ChatTurn("assistant", "A **block** holds the keys and values of "
                                   "16 tokens.\n\n- blocks are allocated on demand\n"
                                   "- equal prefixes share blocks",
                                   "TTFT 52 ms · 41.0 tok/s · 23 tokens"),
                      ])


def make_app(tmp_path, **kwargs) -> KvdeckApp:
    factory = FakeFactory(frozen_stats=demo_stats_series(SNAPSHOTS), **kwargs)
    app = KvdeckApp(factory, model_name="fake-llama", transcript_dir=tmp_path / "chats")
    app.animation_level = "none"  # no half-slid tab underline in the pictures
    return app


async def settle_deck(pilot) -> None:
    app = pilot.app
    assert await wait_for(pilot, lambda: app.engine_ready
                          and app.dashboard_state.version >= SNAPSHOTS)
    ttft, itl = demo_latencies()
    origin = app.dashboard_state.origin
    for t, value in ttft:
        app.dashboard_state.add_ttft(origin + t, value)
    for t, value in itl:
        app.dashboard_state.add_itl(origin + t, value)
    await app.screen.chat.show_transcript(demo_transcript())
    app.screen.query_one("#prompt").cursor_blink = False  # a blinking cursor is a coin toss
    await pilot.pause(0.3)  # one dashboard refresh tick
    # Under load the tick that first fills the request table can come late: wait until the
    # dashboard has drawn the latest stats, then for idle, when the table measures its new
    # rows (before, a picture once caught the id column at its header's width).
    dashboard = app.screen.query_one(Dashboard)
    assert await wait_for(pilot, lambda: dashboard._seen_version == app.dashboard_state.version)
    # The table measures new rows when idle, and a loaded machine can take the picture
    # first (pictures caught "chat-1a2b" cut to the header's width, "chat-1a"): wait until
    # the column is measured and the widest id is drawn whole, as the picture will draw it.
    table = app.screen.query_one(RequestTable)
    id_column = table.columns[ColumnKey("id")]
    widest = max((r.request_id for r in app.dashboard_state.stats.requests), key=len)

    def drawn_whole() -> bool:
        if id_column.content_width < len(widest):
            return False
        if table.region.height <= 1:  # not on screen (a narrow terminal shows the chat)
            return True
        return any(widest in table.render_line(y).text for y in range(1, table.size.height))
    assert await wait_for(pilot, drawn_whole)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare, tmp_path, size):
    assert snap_compare(make_app(tmp_path), terminal_size=size, run_before=settle_deck)


def test_main_screen_light_theme(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await settle_deck(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause(0.3)

    assert snap_compare(make_app(tmp_path), terminal_size=(160, 48), run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_pane_latency_tab(snap_compare, tmp_path, size):
    async def run_before(pilot) -> None:
        await settle_deck(pilot)
        await pilot.press("f3")
        await pilot.pause(0.3)

    assert snap_compare(make_app(tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_dashboard_pane_with_a_request_selected(snap_compare, tmp_path, size):
    """The inspector's block table gets the lines it needs, even at 80x24."""

    async def run_before(pilot) -> None:
        await settle_deck(pilot)
        if pilot.app.screen.has_class("-narrow"):
            await pilot.press("f2")
        table = pilot.app.screen.query_one("#request-table")
        table.focus()
        await pilot.press("down", "down", "down")  # load1-2: 16 blocks, the longest table
        await pilot.pause(0.3)

    assert snap_compare(make_app(tmp_path), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help_screen(snap_compare, tmp_path, size):
    async def run_before(pilot) -> None:
        await settle_deck(pilot)
        await pilot.press("f1")
        assert await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))

    assert snap_compare(make_app(tmp_path), terminal_size=size, run_before=run_before)


def test_engine_settings_form(snap_compare, tmp_path):
    """Every field's label shows (a grid row too short once hid them)."""
    async def run_before(pilot) -> None:
        await settle_deck(pilot)
        settings = EngineSettings(speculation="ngram", num_speculative_tokens=6)
        await pilot.app.push_screen(EngineSettingsScreen(settings))
        await pilot.pause(0.2)

    assert snap_compare(make_app(tmp_path), terminal_size=(100, 30), run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_error_screen(snap_compare, tmp_path, size):
    async def run_before(pilot) -> None:
        assert await wait_for(pilot, lambda: isinstance(pilot.app.screen, EngineErrorScreen))
        await pilot.pause(0.1)

    app = make_app(tmp_path, fail_start="CUDA out of memory: tried to allocate 2.00 GiB "
                   "(the KV pool); lower --gpu-memory-utilization or --max-model-len")
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_models_screen_offline(snap_compare, tmp_path, size, monkeypatch):
    """No network, no GPU: the bundled model and an added folder are listed; Fits explains."""
    import shutil

    from textual.app import App

    from kvdeck.app.store import local_models
    from kvdeck.app.store.cpu_plan import CpuFeatures
    from kvdeck.assets import demo_model_dir
    from kvdeck.tui.screens.models_screen import ModelsScreen

    monkeypatch.setenv("KVDECK_HOME", str(tmp_path / "kvdeck-home"))
    monkeypatch.setenv("HF_HOME", "/nonexistent/huggingface")  # the same path in every run
    monkeypatch.setattr(local_models, "free_disk_bytes", lambda path=None: 50 * 10**9)
    folder = tmp_path / "my-model"
    shutil.copytree(demo_model_dir(), folder)
    local_models.add_folder(folder, "my-model")

    class ModelsApp(App):
        def on_mount(self) -> None:
            # A CPU with bf16 and the INT4 kernels, whatever this one has: the same text everywhere.
            self.push_screen(ModelsScreen(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 16 * 10**9,
                                          cpu=CpuFeatures(True, True, True, ram_bytes=64 * 10**9)))

    assert snap_compare(ModelsApp(), terminal_size=size)


def test_quantize_dialog_asks_before_a_long_job(snap_compare):
    """Both methods with their time here and summary, the group sizes that fit, the quality
    trade-off, how AWQ's time was measured, and the question Enter raises for a job over 2 min."""
    from textual.app import App

    from kvdeck.app.jobs.quantize_estimate import MethodEstimate, QuantizeEstimate
    from kvdeck.tui.screens.quantize_dialog import QuantizeDialog

    estimate = QuantizeEstimate(
        MethodEstimate("rtn", 9.0, "one layer rounded in 180 ms here, x 30 layers, plus loading, "
                                   "writing and start-up"),
        MethodEstimate("awq", 262.0, "the first layer's AWQ on 64 calibration sequences took 8.2 s "
                                     "here, x 30 layers, plus loading, writing and start-up"))

    class DialogApp(App):
        def on_mount(self) -> None:
            self.push_screen(QuantizeDialog(
                "SmolLM2-135M-Instruct", [64, 32], estimate=estimate,
                group_note="Not offered: 128: hidden_size = 576 is not divisible by 128."))

    async def run_before(pilot) -> None:
        await pilot.press("enter")
        await pilot.pause(0.1)

    assert snap_compare(DialogApp(), terminal_size=(100, 30), run_before=run_before)
