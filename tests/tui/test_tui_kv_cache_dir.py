"""The TUI keeps the prefix cache on disk by default (the server and the offline API do not)."""

from kvdeck.engine.types.config import EngineConfig
from kvdeck.tui.engine_factory import tui_kv_cache_dir


def test_default_folder_is_under_the_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path))
    assert tui_kv_cache_dir({"max_model_len": 512}) == {"max_model_len": 512,
                                                         "kv_cache_dir": str(tmp_path / "cache" / "kv")}
    assert EngineConfig().kv_cache_dir is None  # off for the server and LLM(...)


def test_a_folder_of_the_users_or_off(tmp_path):
    assert tui_kv_cache_dir({"kv_cache_dir": str(tmp_path)}) == {"kv_cache_dir": str(tmp_path)}
    for off in ("off", "OFF", "none"):
        assert tui_kv_cache_dir({"kv_cache_dir": off, "seed": 1}) == {"seed": 1}
