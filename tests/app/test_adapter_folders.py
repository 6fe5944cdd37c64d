"""LoRA adapter folders beside the local models: found in the store and beside an added
folder, with their base model and rank (or why the engine would refuse them), and listed
on the Models screen."""

import json
import shutil

import pytest
from textual.app import App

from kvdeck.app.store import local_models, paths
from kvdeck.app.store.adapter_folders import find_adapters
from kvdeck.tui.screens.models_screen import ModelsScreen
from kvdeck.tui.widgets.model_tables import AdaptersTable

pytestmark = pytest.mark.timeout(60)


def _adapter(folder, base, rank=8, **config):
    folder.mkdir(parents=True)
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
            "base_model_name_or_path": base, **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    (folder / "adapter_model.safetensors").write_bytes(b"read by the engine")
    return folder


@pytest.fixture
def models_with_adapters(kvdeck_env, hub_model_dir):
    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")
    mine = kvdeck_env / "my models"
    shutil.copytree(hub_model_dir, mine / "other-llama")
    local_models.add_folder(mine / "other-llama")
    _adapter(paths.store_dir() / "adapters" / "sql", "tiny-llama", rank=16)
    _adapter(mine / "code", str(mine / "other-llama"))
    _adapter(mine / "other-llama" / "lora" / "chat", "someone/else")
    _adapter(mine / "broken", "tiny-llama", target_modules=["lm_head"])
    return kvdeck_env


def test_finds_adapters_beside_models_with_base_and_rank(models_with_adapters):
    found = {a.name: a for a in find_adapters(local_models.list_models())}
    assert sorted(found) == ["broken", "chat", "code", "sql"]
    assert (found["sql"].base_model, found["sql"].rank) == ("tiny-llama", 16)
    assert found["code"].base_model == "other-llama" and found["code"].target_modules == ("q_proj", "v_proj")
    assert found["chat"].base == "someone/else" and found["chat"].base_model is None
    assert not found["broken"].usable and "unknown target module(s) lm_head" in found["broken"].problem


class ModelsApp(App):
    def on_mount(self) -> None:
        self.push_screen(ModelsScreen(free_gpu_bytes=lambda: None, free_ram_bytes=lambda: 16 * 10**9))


async def test_models_screen_lists_adapters(models_with_adapters):
    app = ModelsApp()
    async with app.run_test(size=(140, 48)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(AdaptersTable)
        assert table.display
        rows = {table.get_row(key)[0]: table.get_row(key) for key in table.rows}
        assert sorted(rows) == ["broken", "chat", "code", "sql"]
        assert [str(cell) for cell in rows["sql"][1:4]] == ["tiny-llama", "16", "q,v"]
        assert "lm_head" in str(rows["broken"][3])


async def test_no_adapters_no_section(kvdeck_env):
    app = ModelsApp()
    async with app.run_test(size=(140, 48)) as pilot:
        await pilot.pause()
        assert not app.screen.query_one(AdaptersTable).display


async def test_an_adapter_folder_is_added_from_the_input(kvdeck_env):
    elsewhere = _adapter(kvdeck_env / "downloads" / "sql-lora", "someone/base", rank=4)
    bad = _adapter(kvdeck_env / "downloads" / "dora", "someone/base", use_dora=True)
    app = ModelsApp()
    async with app.run_test(size=(140, 48)) as pilot:
        await pilot.pause()
        repo_input = app.screen.query_one("#repo-input")
        for folder in (bad, elsewhere):
            repo_input.value = str(folder)
            app.screen.action_pull()
            await pilot.pause()
        table = app.screen.query_one(AdaptersTable)
        assert [key.value for key in table.rows] == [str(elsewhere)]  # the DoRA one refused
        assert [str(c) for c in table.get_row(str(elsewhere))[:3]] == ["sql-lora", "someone/base", "4"]
    # Listed from the registry from now on (nothing was copied).
    assert [a.path for a in find_adapters([])] == [elsewhere]
