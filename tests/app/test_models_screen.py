"""Pilot tests of the Models screen: list, download (loopback hub), delete, quantise, load."""

import shutil

import pytest
from textual.app import App

from kvdeck.app.jobs.quantize import QuantizeOptions
from kvdeck.app.store import local_models, paths
from kvdeck.tui.messages import SwitchModelRequested
from kvdeck.tui.screens.models_screen import ConfirmDeleteScreen, ModelsScreen
from kvdeck.tui.widgets.model_tables import LocalModelsTable, RecommendedTable
from kvdeck.tui.widgets.model_task_panel import ModelTaskPanel

pytestmark = pytest.mark.timeout(180)
GiB = 1024**3


class ModelsApp(App):
    def __init__(self, **screen_kwargs) -> None:
        super().__init__()
        self.loaded = []
        self.screen_kwargs = screen_kwargs

    def on_mount(self) -> None:
        self.push_screen(ModelsScreen(**self.screen_kwargs))

    def on_switch_model_requested(self, message: SwitchModelRequested) -> None:
        self.loaded.append(message.name)


async def _wait_for(pilot, condition, seconds: float = 60.0) -> None:
    for _ in range(int(seconds / 0.1)):
        if condition():
            return
        await pilot.pause(0.1)
    panel = pilot.app.screen.query(ModelTaskPanel)
    status = panel.first().status_text if panel else "(no panel)"
    raise AssertionError(f"condition not met in time; task status: {status!r}")


def _rows(app) -> list[str]:
    table = app.screen.query_one(LocalModelsTable)
    return [key.value for key in table.rows]


def _status(app) -> str:
    return app.screen.query_one(ModelTaskPanel).status_text


@pytest.fixture
def stored_tiny(kvdeck_env, hub_model_dir):
    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")


async def test_lists_local_and_recommended_models(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: 4 * GiB)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _rows(app) == ["tiny-llama"]
        rec = app.screen.query_one(RecommendedTable)
        row = rec.get_row("Qwen/Qwen2.5-0.5B-Instruct")
        assert str(row[5]) == "yes"  # 2 GB fits in 4 GB
        assert str(rec.get_row("Qwen/Qwen3-8B")[5]) == "no"
        title = str(app.screen.query_one("#models-title").content)
        assert "disk free" in title and "GPU free 4.3 GB" in title


async def test_download_from_input_then_delete_with_confirmation(hub):
    app = ModelsApp(free_gpu_bytes=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.click("#repo-input")
        await pilot.press(*"tiny/missing", "enter")
        await _wait_for(pilot, lambda: "no such model" in _status(app))
        assert _rows(app) == []

        app.screen.query_one("#repo-input").value = ""
        await pilot.press(*"tiny/llama", "enter")
        await _wait_for(pilot, lambda: "verified and added" in _status(app))
        assert _rows(app) == ["tiny/llama"]

        app.screen.query_one(LocalModelsTable).focus()
        await pilot.press("x")
        await _wait_for(pilot, lambda: isinstance(app.screen, ConfirmDeleteScreen))
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen) and _rows(app) == ["tiny/llama"]
        await pilot.press("x")
        await _wait_for(pilot, lambda: isinstance(app.screen, ConfirmDeleteScreen))
        await pilot.press("y")
        await _wait_for(pilot, lambda: _rows(app) == [])
        assert local_models.list_models() == []


async def test_cancelled_download_is_listed_as_incomplete_and_resumes(hub):
    app = ModelsApp(free_gpu_bytes=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        screen.query_one("#repo-input").value = "tiny/llama"
        # Cancel as soon as the first bytes arrive: the worker stops between chunks.
        original = screen._show_download

        def cancel_on_weights(p):
            original(p)
            if p.done_bytes > 0 and screen.download_cancel is not None:
                screen.action_cancel_task()

        screen._show_download = cancel_on_weights
        await pilot.click("#pull-button")
        await _wait_for(pilot, lambda: "cancelled" in _status(app))
        assert _rows(app) == ["pending:tiny/llama"]
        screen._show_download = original
        screen.query_one("#repo-input").value = ""
        screen.query_one(LocalModelsTable).focus()
        await pilot.press("enter")  # on the incomplete row: resume
        await _wait_for(pilot, lambda: "verified and added" in _status(app))
        assert _rows(app) == ["tiny/llama"]


@pytest.mark.slow
async def test_quantise_compare_then_load(stored_tiny):
    options = QuantizeOptions(num_samples=4, seq_len=64, device="cpu", num_threads=1)
    compare = {"seq_len": 64, "max_windows": 2, "device": "cpu", "num_threads": 1}
    app = ModelsApp(free_gpu_bytes=lambda: None, quantize_options=options,
                    compare_options=compare)
    async with app.run_test(size=(120, 40)) as pilot:
        app.screen.query_one(LocalModelsTable).focus()
        await pilot.press("a")
        await _wait_for(pilot, lambda: "added" in _status(app), seconds=40)
        assert "tiny-llama-awq added" in _status(app) and "smaller" in _status(app)
        assert _rows(app) == ["tiny-llama", "tiny-llama-awq"]
        await pilot.press("down", "l")
        await pilot.pause()
        assert app.loaded == ["tiny-llama-awq"]
        await pilot.press("e")
        await _wait_for(pilot, lambda: "perplexity" in _status(app) and "vs" in _status(app),
                        seconds=60)
        assert "x smaller; perplexity" in _status(app) and "on 126 tokens" in _status(app)


async def test_typing_with_a_table_focused_goes_to_the_input_not_to_shortcuts(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        app.screen.query_one(LocalModelsTable).focus()
        await pilot.press(*"pa/lex")  # "p" is no shortcut here: it moves to the input, and so on
        assert app.screen.query_one("#repo-input").value == "pa/lex"
        assert not app.screen.busy and app.loaded == []
        assert not app.screen.query_one(ModelTaskPanel).has_class("-active")
