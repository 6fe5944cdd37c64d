"""Pilot tests of the Models screen: list, download (loopback hub), delete, quantise, load."""

import shutil
import threading

import pytest
from textual.app import App
from textual.geometry import Region

from kvdeck.app.jobs.quantize import QuantizeOptions
from kvdeck.app.store import local_models, paths
from kvdeck.app.store.local_models import BUNDLED_NAME
from kvdeck.assets import calibration_text, demo_model_dir
from kvdeck.tui.messages import SwitchModelRequested
from kvdeck.tui.screens.models_screen import ConfirmDeleteScreen, ModelsScreen
from kvdeck.tui.screens.path_prompt import PathPromptScreen
from kvdeck.tui.screens.quantize_dialog import QuantizeDialog
from kvdeck.tui.widgets.model_tables import LocalModelsTable, RecommendedTable
from kvdeck.tui.widgets.model_task_panel import ModelTaskPanel

pytestmark = pytest.mark.timeout(180)
GiB = 1024**3


class ModelsApp(App):
    def __init__(self, **screen_kwargs) -> None:
        super().__init__()
        self.loaded = []
        self.loaded_paths = []
        self.screen_kwargs = screen_kwargs

    def on_mount(self) -> None:
        self.push_screen(ModelsScreen(**self.screen_kwargs))

    def on_switch_model_requested(self, message: SwitchModelRequested) -> None:
        self.loaded.append(message.name)
        self.loaded_paths.append(message.model)


async def _wait_for(pilot, condition, seconds: float = 60.0) -> None:
    for _ in range(int(seconds / 0.1)):
        if condition():
            return
        await pilot.pause(0.1)
    panel = pilot.app.screen.query(ModelTaskPanel)
    status = panel.first().status_text if panel else "(no panel)"
    raise AssertionError(f"condition not met in time; task status: {status!r}")


def _rows(app) -> list[str]:
    """The listed models besides the bundled demo model (always listed, first)."""
    table = app.screen.query_one(LocalModelsTable)
    keys = [key.value for key in table.rows]
    assert keys[0] == BUNDLED_NAME
    return keys[1:]


def _status(app) -> str:
    return app.screen.query_one(ModelTaskPanel).status_text


@pytest.fixture
def stored_tiny(kvdeck_env, hub_model_dir):
    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")


@pytest.fixture
def tiny_folder(kvdeck_env, hub_model_dir):
    """The tiny model in a folder of the user's, outside kvdeck's store and the hub cache."""
    folder = kvdeck_env / "my models" / "tiny-llama"
    shutil.copytree(hub_model_dir, folder)
    return folder


async def test_lists_local_and_recommended_models(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: 4 * GiB)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _rows(app) == ["tiny-llama"]
        rec = app.screen.query_one(RecommendedTable)
        row = rec.get_row("Qwen/Qwen2.5-0.5B-Instruct")
        assert str(row[5]) == "yes"  # 2 GB fits in 4 GB
        assert str(rec.get_row("Qwen/Qwen3-8B")[5]) == "no"
        title = app.screen.query_one("#models-title").flowed(200).plain
        assert title.startswith("Models · disk free") and " · GPU free 4.3 GB · cache " in title


async def test_the_title_breaks_between_its_figures_on_a_small_terminal(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 16 * GiB)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        title = app.screen.query_one("#models-title")
        lines = [strip.text for strip in title.render_lines(Region(0, 0, *title.outer_size))]
        def bare(text: str) -> str:  # a break replaces a separator
            return text.replace(" ", "").replace("·", "")

        assert bare("".join(lines)) == bare(title.flowed(200).plain)  # nothing cut off
        for figure in ("Models", "disk free ", "no GPU seen", "RAM free 17.2 GB"):
            assert any(figure in line for line in lines)
        assert any(line.strip().startswith("cache") for line in lines)  # on lines of its own


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
        await pilot.press("down")  # past the bundled model, listed first
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
        panel = screen.query_one(ModelTaskPanel)
        original = panel.show_download

        def cancel_on_weights(p):
            original(p)
            if p.done_bytes > 0 and screen.tasks.download_cancel is not None:
                screen.action_cancel_task()

        panel.show_download = cancel_on_weights
        await pilot.click("#pull-button")
        await _wait_for(pilot, lambda: "cancelled" in _status(app))
        assert _rows(app) == ["pending:tiny/llama"]
        panel.show_download = original
        screen.query_one("#repo-input").value = ""
        screen.query_one(LocalModelsTable).focus()
        await pilot.press("down", "enter")  # on the incomplete row (after the bundled one): resume
        await _wait_for(pilot, lambda: "verified and added" in _status(app))
        assert _rows(app) == ["tiny/llama"]


class InstantProbe:
    """The quantise dialog's probe, answering at once with a short estimate for both methods."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int | None]] = []

    def __call__(self, model, options, on_estimate, on_step, on_end, group_size=None):
        from kvdeck.app.jobs.quantize_estimate import MethodEstimate, QuantizeEstimate

        self.asked.append((model.name, group_size))
        estimate = QuantizeEstimate(MethodEstimate("rtn", 5.0, "fake"), MethodEstimate("awq", 30.0, "fake"))
        threading.Thread(target=lambda: (on_estimate(estimate), on_end(None)), daemon=True).start()
        return self

    def cancel_in_background(self) -> None:
        pass


@pytest.mark.slow
async def test_quantise_compare_then_load(tiny_folder):
    options = QuantizeOptions(num_samples=4, seq_len=64, device="cpu", num_threads=1)
    compare = {"seq_len": 64, "max_windows": 2, "device": "cpu", "num_threads": 1}
    probe = InstantProbe()
    app = ModelsApp(free_gpu_bytes=lambda: None, quantize_options=options,
                    compare_options=compare, quantize_probe=probe)
    async with app.run_test(size=(120, 40)) as pilot:
        local_models.add_folder(tiny_folder)  # as `kvdeck models add` does, with no network
        app.screen.action_refresh()
        app.screen.query_one(LocalModelsTable).focus()
        await pilot.press("down", "a")  # tiny-llama, below the bundled model
        await _wait_for(pilot, lambda: isinstance(app.screen, QuantizeDialog))
        await _wait_for(pilot, lambda: "about 30 s here" in str(app.screen.query_one("#method-awq").label))
        assert probe.asked == [("tiny-llama", 128)]
        await pilot.press("enter")  # AWQ, the default, in under two minutes: no question
        await _wait_for(pilot, lambda: "added" in _status(app), seconds=40)
        assert "tiny-llama-awq added" in _status(app) and "smaller" in _status(app)
        assert _rows(app) == ["tiny-llama", "tiny-llama-awq"]
        await pilot.press("down", "l")
        await pilot.pause()
        assert app.loaded == ["tiny-llama-awq"]
        # No heldout.txt ships with tiny-llama: the comparison asks for a text, and refuses
        # the calibration text (AWQ fitted its scales on it).
        await pilot.press("e")
        await _wait_for(pilot, lambda: isinstance(app.screen, PathPromptScreen))
        prompt = app.screen
        prompt.query_one("#path-input").value = str(calibration_text())
        await pilot.press("enter")
        await pilot.pause()
        assert "calibration text" in str(prompt.query_one("#path-error").render())
        heldout = demo_model_dir() / "heldout.txt"
        prompt.query_one("#path-input").value = str(heldout)
        await pilot.press("enter")
        await _wait_for(pilot, lambda: "perplexity" in _status(app) and "vs" in _status(app),
                        seconds=60)
        assert "x smaller; perplexity" in _status(app) and "on 126 tokens" in _status(app)
        assert "of heldout.txt" in _status(app)
        assert app.screen.query_one(ModelTaskPanel).percent == 100.0


async def test_typing_with_a_table_focused_goes_to_the_input_not_to_shortcuts(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        app.screen.query_one(LocalModelsTable).focus()
        await pilot.press(*"pa/lex")  # "p" is no shortcut here: it moves to the input, and so on
        assert app.screen.query_one("#repo-input").value == "pa/lex"
        assert not app.screen.busy and app.loaded == []
        assert not app.screen.query_one(ModelTaskPanel).has_class("-active")


async def test_offline_the_bundled_model_and_a_typed_folder_are_listed_and_loadable(tiny_folder):
    app = ModelsApp(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 64 * GiB)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(LocalModelsTable)
        assert _rows(app) == [] and "bundled" in str(table.get_row(BUNDLED_NAME)[8])
        # With no GPU the Fits column says it measures RAM, and the note says why.
        rec = app.screen.query_one(RecommendedTable)
        assert str(rec.get_row("Qwen/Qwen2.5-0.5B-Instruct")[5]) == "yes (CPU)"
        assert "no GPU seen" in str(app.screen.query_one("#fits-note").render())
        # Typing a folder's path with the table focused: it lands in the input, Enter adds it.
        table.focus()
        await pilot.press(*str(tiny_folder), "enter")
        await _wait_for(pilot, lambda: _rows(app) == ["tiny-llama"])
        assert "folder" in str(table.get_row("tiny-llama")[8])
        assert table.selected_key() == "tiny-llama"
        await pilot.press("l")
        assert await_loaded(app, ["tiny-llama"], [str(tiny_folder.resolve())])
        table.select_key(BUNDLED_NAME)
        await pilot.press("l")  # the bundled model loads as the engine's default (no path)
        assert await_loaded(app, ["tiny-llama", BUNDLED_NAME], [str(tiny_folder.resolve()), None])
        await pilot.press("x")  # part of kvdeck: not deleted, and no question asked
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen)
        assert any("part of kvdeck" in n.message for n in app._notifications)
        # An added folder is only taken off the list: its files stay.
        table.select_key("tiny-llama")
        await pilot.press("x")
        await _wait_for(pilot, lambda: isinstance(app.screen, ConfirmDeleteScreen))
        assert "left on disk" in str(app.screen.query_one("#confirm-text").render())
        await pilot.press("y")
        await _wait_for(pilot, lambda: _rows(app) == [])
        assert (tiny_folder / "config.json").is_file()


def await_loaded(app, names, paths_) -> bool:
    return app.loaded == names and app.loaded_paths == paths_


async def test_deleting_the_loaded_model_switches_the_engine_away_first(stored_tiny):
    from types import SimpleNamespace

    from kvdeck.tui.engine_session import EngineSession

    engine = EngineSession()
    engine_client = SimpleNamespace(model_dir=paths.store_dir() / "tiny-llama")
    engine.mark_running(engine_client)
    app = ModelsApp(free_gpu_bytes=lambda: None, engine=engine)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one(LocalModelsTable)
        assert "loaded" in str(table.get_row("tiny-llama")[8])
        table.focus()
        table.select_key("tiny-llama")
        await pilot.press("x")
        await _wait_for(pilot, lambda: isinstance(app.screen, ConfirmDeleteScreen))
        assert "loaded in the engine" in str(app.screen.query_one("#confirm-text").render())
        await pilot.press("y")
        await _wait_for(pilot, lambda: app.loaded == [BUNDLED_NAME])
        assert app.loaded_paths == [None]
        await pilot.pause(0.3)
        assert (paths.store_dir() / "tiny-llama").exists()  # the engine still holds it
        engine.mark_stopped(engine_client)  # the app has stopped that engine process
        await _wait_for(pilot, lambda: _rows(app) == [])
        assert not (paths.store_dir() / "tiny-llama").exists()


async def test_on_the_cpu_the_note_names_the_dtype_the_engine_runs(stored_tiny):
    from kvdeck.app.store.cpu_plan import CpuFeatures

    for cpu, says in ((CpuFeatures(True, True, True), "in bfloat16 for bf16 and INT4 checkpoints"),
                      (CpuFeatures(False, False, False), "kvdeck runs on the CPU, in float32)")):
        app = ModelsApp(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 64 * GiB, cpu=cpu)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause()
            note = str(app.screen.query_one("#fits-note").render())
            assert says in note, note


async def test_a_model_imported_from_a_quantised_gguf_says_so_in_quant(stored_tiny):
    from kvdeck.app.store import registry

    registry.mark_verified(registry.store_key("tiny-llama"), {
        "path": str(paths.store_dir() / "tiny-llama"), "method": "gguf-import",
        "gguf_file": "/nowhere/tiny.Q4_1.gguf", "gguf_quantization": "Q4_1"})
    app = ModelsApp(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 64 * GiB)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(LocalModelsTable)
        assert str(table.get_row("tiny-llama")[4]) == "Q4_1 (imported as fp16)"  # not "-"
        assert str(table.get_row(BUNDLED_NAME)[4]) == "-"


async def test_the_load_notice_says_the_tables_needs(stored_tiny):
    app = ModelsApp(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 64 * GiB)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(LocalModelsTable)
        needs = str(table.get_row("tiny-llama")[6])
        table.focus()
        table.select_key("tiny-llama")
        await pilot.press("l")
        await _wait_for(pilot, lambda: app.loaded == ["tiny-llama"])
        notice = next(n.message for n in app._notifications if n.message.startswith("Loading"))
        assert f"needs about {needs}, " in notice and "with the runtime" in notice


async def test_dtype_is_what_the_engine_runs_with_the_checkpoints_in_brackets(stored_tiny):
    import json

    from kvdeck.app.store.cpu_plan import CpuFeatures

    config_path = paths.store_dir() / "tiny-llama" / "config.json"
    bf16_copy = paths.store_dir() / "tiny-bf16"
    shutil.copytree(paths.store_dir() / "tiny-llama", bf16_copy)
    config = json.loads(config_path.read_text())
    config.pop("torch_dtype", None)
    (bf16_copy / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    everything = CpuFeatures(True, True, True, ram_bytes=64 * GiB)
    nothing = CpuFeatures(False, False, False, ram_bytes=64 * GiB)
    cases = [(None, everything, {"tiny-llama": "fp32 (fp16)", "tiny-bf16": "bf16"}),
             (None, nothing, {"tiny-llama": "fp32 (fp16)", "tiny-bf16": "fp32 (bf16)"}),
             (8 * GiB, None, {"tiny-llama": "fp16", "tiny-bf16": "bf16"})]  # on a GPU: as stored
    for gpu, cpu, expected in cases:
        app = ModelsApp(free_gpu_bytes=lambda gpu=gpu: gpu, free_ram_bytes=lambda: 64 * GiB, cpu=cpu)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause()
            table = app.screen.query_one(LocalModelsTable)
            assert {name: str(table.get_row(name)[3]) for name in expected} == expected
            assert str(table.get_row(BUNDLED_NAME)[3]) == ("fp32 (fp16)" if gpu is None else "fp16")


def test_an_int4_checkpoint_runs_bf16_where_the_int4_kernels_do():
    from pathlib import Path

    from kvdeck.app.store.recommended import MemoryEstimate
    from kvdeck.tui.widgets.model_tables import MemoryBudget, engine_dtype_label

    awq = local_models.LocalModel("m-awq", Path("/nowhere"), "store", "LlamaForCausalLM", 1, "float16",
                                  "awq-int4", 1, True)
    cpu = MemoryBudget("cpu", None)
    assert engine_dtype_label(awq, cpu, MemoryEstimate(1, 1, 1, dtype="bfloat16")) == "bf16 (fp16)"
    assert engine_dtype_label(awq, cpu, None) == "fp16"  # unreadable: as stored
    assert engine_dtype_label(awq, MemoryBudget("cuda", None), None) == "fp16"


@pytest.mark.slow
async def test_rtn_from_the_dialog_and_its_progress_says_rtn(tiny_folder):
    options = QuantizeOptions(device="cpu", num_threads=1)
    app = ModelsApp(free_gpu_bytes=lambda: None, quantize_options=options, quantize_probe=InstantProbe())
    async with app.run_test(size=(120, 40)) as pilot:
        local_models.add_folder(tiny_folder)
        app.screen.action_refresh()
        table = app.screen.query_one(LocalModelsTable)
        table.focus()
        table.select_key("tiny-llama")
        statuses: list[str] = []
        panel = app.screen.query_one(ModelTaskPanel)
        show = panel.show_quantize
        panel.show_quantize = lambda p: (show(p), statuses.append(_status(app)))
        await pilot.press("a")
        await _wait_for(pilot, lambda: isinstance(app.screen, QuantizeDialog))
        await pilot.press("r", "enter")
        await _wait_for(pilot, lambda: "added" in _status(app), seconds=60)
        title = str(app.screen.query_one("#task-title").render())
        assert title == "Quantising tiny-llama to RTN INT4, group 128 → tiny-llama-rtn"
        assert statuses and all(s.startswith("RTN · ") for s in statuses)
        assert "rounding the weights to nearest" in " ".join(statuses)
        assert "AWQ" not in " ".join(statuses) + title
        model = local_models.find_model("tiny-llama-rtn")
        assert model is not None and model.quantization == "awq-int4"  # AutoAWQ's layout
        from kvdeck.app.store import registry

        assert registry.read()["verified"][registry.store_key("tiny-llama-rtn")]["method"] == "rtn"


async def test_the_dialog_is_not_offered_for_what_cannot_be_quantised(stored_tiny):
    import json

    app = ModelsApp(free_gpu_bytes=lambda: None, quantize_probe=InstantProbe())
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one(LocalModelsTable)
        table.focus()
        config_path = paths.store_dir() / "tiny-llama" / "config.json"
        config = json.loads(config_path.read_text())
        config_path.write_text(json.dumps({**config, "hidden_size": 100}))  # no group size divides 100
        table.select_key("tiny-llama")
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen)
        assert any("no INT4 group size" in n.message for n in app._notifications)
        config_path.write_text(json.dumps(config))
        await pilot.press("a")
        await _wait_for(pilot, lambda: isinstance(app.screen, QuantizeDialog))
        assert app.screen.group_sizes == [128, 64, 32]
        await pilot.press("escape")
        await _wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        assert not app.screen.busy
