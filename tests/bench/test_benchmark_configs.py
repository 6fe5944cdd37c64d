"""The real-model configs shipped for dummy-weight benchmarks parse and build."""

from pathlib import Path

import pytest
import torch

from kvdeck.engine.runner.models import model_class_for
from kvdeck.engine.runner.models.linear import UnquantizedLinearMethod
from kvdeck.engine.types.model_config import read_model_config
from kvdeck.kernels.dispatch import TORCH_OPS

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"
# Published parameter counts of the real models.
EXPECTED_PARAMS = {"qwen3-0.6b": 596_049_920, "llama-3.2-1b": 1_235_814_400,
                   "llama-3.1-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS))
def test_config_builds_the_published_model_size(name):
    cfg = read_model_config(CONFIGS / name)
    with torch.device("meta"):
        model = model_class_for(cfg.architecture)(cfg, TORCH_OPS, UnquantizedLinearMethod(),
                                                  torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]
