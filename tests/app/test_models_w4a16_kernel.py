"""`kvdeck models` names the kernel that serves an AWQ/GPTQ INT4 model on this machine
(kernels/w4a16_choice.py, the rule the Models screen shares), and says nothing of it when no
listed model is INT4."""

import json
import shutil

import pytest

from kvdeck.app.cli import main
from kvdeck.app.store.cpu_plan import CpuFeatures
from kvdeck.kernels.w4a16_choice import is_w4a16, w4a16_serving_kernel


def _store_awq_model(hub_model_dir, name: str = "tiny-awq"):
    from kvdeck.app.store import paths

    folder = paths.store_dir() / name
    shutil.copytree(hub_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128,
                                     "zero_point": True, "version": "gemm"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("cuda", "int4", "env", "expected"), [
    (False, True, "auto", "cpu int4 kernels"),
    (False, False, "auto", "torch reference (dequantise + matmul)"),
    (True, False, "auto", "triton w4a16 marlin (repacked at load)"),  # the H200 run's choice
    (True, False, "awq", "triton w4a16 (AutoAWQ layout)"),
    (True, True, "marlin", "triton w4a16 marlin (repacked at load)"),
])
def test_models_names_the_w4a16_kernel(kvdeck_env, hub_model_dir, capsys, monkeypatch,
                                       cuda, int4, env, expected):
    import torch

    _store_awq_model(hub_model_dir)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr("kvdeck.app.cli.models.cpu_features",
                        lambda: CpuFeatures(True, False, int4, ram_bytes=8 * 2**30))
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", env)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert f"W4A16 (AWQ/GPTQ INT4) models run on: {expected}\n" in out
    assert main(["models", "--json"]) == 0
    [model] = json.loads(capsys.readouterr().out)["models"]
    assert model["quantization"] == "awq-int4" and model["w4a16_kernel"] == expected


def test_models_without_int4_say_nothing_of_it(kvdeck_env, hub_model_dir, capsys):
    from kvdeck.app.store import paths

    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")
    assert main(["models"]) == 0
    assert "W4A16" not in capsys.readouterr().out
    assert main(["models", "--json"]) == 0
    [model] = json.loads(capsys.readouterr().out)["models"]
    assert model["w4a16_kernel"] is None


def test_which_labels_are_w4a16_and_a_bad_kernel_choice_is_named(monkeypatch):
    assert is_w4a16("awq-int4") and is_w4a16("gptq-int4") and is_w4a16("AWQ")
    assert not any(is_w4a16(q) for q in (None, "", "gptq-int8", "int8", "fp8", "awq-int3"))
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "exllama")
    with pytest.raises(ValueError, match="KVDECK_W4A16_KERNEL must be one of .*'exllama'"):
        w4a16_serving_kernel(on_cuda=True, cpu_int4=False)
