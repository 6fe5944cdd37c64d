"""The Models screen names the kernel that serves an AWQ/GPTQ INT4 model here (the rule
`kvdeck models` prints, kernels/w4a16_choice.py), from the screen's own view of the machine:
a GPU seen by nvidia-smi, else the CPU's features; no line when no listed model is INT4."""

import json
import shutil

import pytest

from kvdeck.app.store.cpu_plan import CpuFeatures


def _models_app(tmp_path, monkeypatch, quantized: bool, gpu_bytes: int | None, int4: bool):
    from textual.app import App

    from kvdeck.app.store import local_models
    from kvdeck.assets import demo_model_dir
    from kvdeck.tui.screens.models_screen import ModelsScreen

    monkeypatch.setattr(local_models, "free_disk_bytes", lambda path=None: 50 * 10**9)
    folder = tmp_path / "my-model"
    shutil.copytree(demo_model_dir(), folder)
    if quantized:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
        (folder / "config.json").write_text(json.dumps(config))
    local_models.add_folder(folder, "my-model")

    class ModelsApp(App):
        def on_mount(self) -> None:
            self.push_screen(ModelsScreen(free_gpu_bytes=lambda: gpu_bytes,
                                          free_ram_bytes=lambda: 16 * 10**9,
                                          cpu=CpuFeatures(True, False, int4, ram_bytes=64 * 10**9)))

    return ModelsApp()


@pytest.mark.parametrize(("gpu_bytes", "int4", "env", "expected"), [
    (None, True, "auto", "cpu int4 kernels"),
    (None, False, "auto", "torch reference (dequantise + matmul)"),
    (40 * 2**30, True, "marlin", "triton w4a16 marlin (repacked at load)"),
    (40 * 2**30, True, "awq", "triton w4a16 (AutoAWQ layout)"),
    (40 * 2**30, True, "bogus", "KVDECK_W4A16_KERNEL must be one of"),  # read on a GPU only
])
async def test_models_screen_names_the_w4a16_kernel(tmp_path, monkeypatch, gpu_bytes, int4, env,
                                                    expected):
    from textual.widgets import Static

    monkeypatch.setenv("KVDECK_W4A16_KERNEL", env)
    app = _models_app(tmp_path, monkeypatch, True, gpu_bytes, int4)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        note = app.screen.query_one("#w4a16-note", Static)
        assert note.display
        assert str(note.render()).startswith(f"W4A16 (AWQ/GPTQ INT4) models run on: {expected}")


async def test_models_screen_has_no_w4a16_line_without_int4_models(tmp_path, monkeypatch):
    from textual.widgets import Static

    app = _models_app(tmp_path, monkeypatch, False, None, True)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        assert not app.screen.query_one("#w4a16-note", Static).display
