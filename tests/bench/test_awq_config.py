"""benchmarks/awq_config.py: the AWQ INT4 model of a shipped shape (run_gpu.sh's throughput
stage) builds INT4 layers of the published size, and a shape the group does not divide is
refused by name. The knobs a result records leave secrets out."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvdeck.app.bench.result import command_line, kvdeck_knobs
from kvdeck.engine.runner.models import model_class_for
from kvdeck.engine.runner.models.linear import get_linear_method
from kvdeck.engine.types.model_config import read_model_config

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_qwen3_awq_builds_int4_projections(tmp_path):
    done = subprocess.run([sys.executable, BENCHMARKS / "awq_config.py",
                           BENCHMARKS / "configs" / "qwen3-0.6b" / "config.json", tmp_path / "awq"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(tmp_path / "awq")
    cfg = read_model_config(tmp_path / "awq")
    assert cfg.quantization_config == {"quant_method": "awq", "bits": 4, "group_size": 128,
                                       "zero_point": True, "version": "gemm"}
    with torch.device("meta"):
        model = model_class_for(cfg.architecture)(
            cfg, None, get_linear_method("awq", cfg.quantization_config), torch.float16)
    packed = {name: p for name, p in model.named_parameters() if name.endswith("qweight")}
    packed |= {name: b for name, b in model.named_buffers() if name.endswith("qweight")}
    # 28 layers of qkv, o, gate_up, down (fused as the engine loads them); eight 4-bit weights
    # per int32.
    assert len(packed) == 28 * 4
    int4_weights = sum(t.numel() * 8 for t in packed.values())
    per_layer = 1024 * (2048 + 1024 + 1024) + 2048 * 1024 + 3 * 1024 * 3072
    assert int4_weights == 28 * per_layer


def test_a_width_the_group_does_not_divide_is_refused(tmp_path):
    source = tmp_path / "config.json"
    source.write_text(json.dumps({"hidden_size": 96, "intermediate_size": 256}))
    done = subprocess.run([sys.executable, BENCHMARKS / "awq_config.py", source, tmp_path / "out",
                           "--group-size", "64"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "hidden_size 96 is not a multiple of the AWQ group size 64" in done.stderr
    assert not (tmp_path / "out").exists()


def test_recorded_knobs_leave_secrets_out(monkeypatch):
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
    monkeypatch.setenv("KVDECK_API_KEY", "sk-local")
    monkeypatch.setenv("KVDECK_HF_TOKEN", "hf_x")
    knobs = kvdeck_knobs()
    assert knobs["KVDECK_W4A16_KERNEL"] == "marlin"
    assert not {"KVDECK_API_KEY", "KVDECK_HF_TOKEN"} & set(knobs)
    with pytest.raises(KeyError):
        knobs["KVDECK_API_KEY"]


def test_the_recorded_command_leaves_secret_options_out():
    words = ["kvdeck", "bench", "serve", "--api-key", "sk-local", "--hf-token=hf_x", "--model", "a b",
             "--max-tokens", "64", "--API_KEY", "x"]
    assert command_line(words) == ("kvdeck bench serve --api-key REDACTED --hf-token=REDACTED --model 'a b' "
                                   "--max-tokens 64 --API_KEY REDACTED")
