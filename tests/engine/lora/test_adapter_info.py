"""LoRARequest, read_adapter_info's checks of a PEFT folder, and the LoRA knobs (no torch)."""

import json
import math

import pytest

from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import (
    LoRARequest,
    check_lora_request,
    lora_cache_key,
    lora_requests_per_prompt,
    read_adapter_info,
)


def _adapter(tmp_path, weights: bool = True, **config):
    folder = tmp_path / "adapter"
    folder.mkdir()
    body = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"],
            "base_model_name_or_path": "tiny-llama", "bias": "none", "modules_to_save": None}
    body.update(config)
    (folder / "adapter_config.json").write_text(json.dumps(body))
    if weights:
        (folder / "adapter_model.safetensors").write_bytes(b"placeholder")
    return folder


def test_reads_a_peft_folder(tmp_path):
    info = read_adapter_info(_adapter(tmp_path))
    assert info.rank == 8 and info.alpha == 16.0
    assert info.target_modules == ("q_proj", "v_proj")  # the model's order, not the file's
    assert info.base_model_name_or_path == "tiny-llama"
    assert info.scaling == 2.0


def test_rslora_scales_by_the_square_root(tmp_path):
    info = read_adapter_info(_adapter(tmp_path, r=16, lora_alpha=8, use_rslora=True))
    assert info.scaling == pytest.approx(8 / math.sqrt(16))


def test_a_single_module_name_is_a_list_of_one(tmp_path):
    assert read_adapter_info(_adapter(tmp_path, target_modules="down_proj")).target_modules == ("down_proj",)


@pytest.mark.parametrize("config, message", [
    ({"r": 0}, "rank r must be a positive integer"),
    ({"r": "8"}, "rank r must be a positive integer"),
    ({"lora_alpha": -1}, "lora_alpha must be a positive number"),
    ({"peft_type": "IA3"}, "is not a LoRA adapter: its peft_type is 'IA3'"),
    ({"target_modules": ["q_proj", "lm_head"]}, "unknown target module(s) lm_head"),
    ({"target_modules": "all-linear"}, "is a pattern"),
    ({"target_modules": []}, "non-empty list"),
    ({"use_dora": True}, "use_dora=True is not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias='all' is not supported"),
])
def test_bad_configs_are_named(tmp_path, config, message):
    with pytest.raises(ValueError) as info:
        read_adapter_info(_adapter(tmp_path, **config))
    assert message in str(info.value) and "adapter" in str(info.value)


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_adapter_info(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        read_adapter_info(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no adapter_config.json"):
        read_adapter_info(tmp_path / "empty")
    folder = _adapter(tmp_path, weights=False)
    with pytest.raises(ValueError, match="no adapter_model.safetensors"):
        read_adapter_info(folder)
    (folder / "adapter_model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="pickled weights are not loaded"):
        read_adapter_info(folder)


def test_bad_json(tmp_path):
    folder = _adapter(tmp_path)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_adapter_info(folder)


def test_lora_request_checks_its_fields():
    LoRARequest("sql", 1, "/a")
    for args in (("", 1, "/a"), ("sql", 0, "/a"), ("sql", True, "/a"), ("sql", 1, "")):
        with pytest.raises(ValueError):
            LoRARequest(*args)


def test_lora_request_needs_lora_on():
    check_lora_request(None, False)
    check_lora_request(LoRARequest("sql", 1, "/a"), True)
    with pytest.raises(ValueError, match="LoRA is off"):
        check_lora_request(LoRARequest("sql", 1, "/a"), False)
    with pytest.raises(ValueError, match="must be a LoRARequest"):
        check_lora_request("sql", True)


def test_one_adapter_per_prompt():
    sql = LoRARequest("sql", 1, "/a")
    assert lora_requests_per_prompt(sql, 2) == [sql, sql]
    assert lora_requests_per_prompt([sql, None], 2) == [sql, None]
    with pytest.raises(ValueError, match="2 lora requests for 3 prompts"):
        lora_requests_per_prompt([sql, None], 3)


def test_cache_key_is_the_adapter_not_the_id():
    assert lora_cache_key(LoRARequest("sql", 1, "/a")) == lora_cache_key(LoRARequest("sql", 7, "/a"))
    assert lora_cache_key(LoRARequest("sql", 1, "/a")) != lora_cache_key(LoRARequest("code", 1, "/a"))


def test_lora_knobs():
    config = EngineConfig(enable_lora=True)
    assert (config.max_loras, config.max_lora_rank, config.cpu_loras) == (4, 64, 4)
    assert EngineConfig(max_loras=2, max_cpu_loras=5).cpu_loras == 5
    with pytest.raises(ValueError, match="max_cpu_loras .* must be >= max_loras"):
        EngineConfig(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="max_lora_rank must be a positive integer"):
        EngineConfig(max_lora_rank=0)
    with pytest.raises(ValueError, match="enable_lora must be True or False"):
        EngineConfig(enable_lora="yes")


def test_exported_from_kvdeck():
    import kvdeck

    assert kvdeck.LoRARequest is LoRARequest


def test_a_path_the_file_system_refuses_is_a_value_error(tmp_path):
    too_long = tmp_path / ("a" * 300)  # longer than a file name may be
    with pytest.raises(ValueError, match="cannot be read"):
        read_adapter_info(too_long)
