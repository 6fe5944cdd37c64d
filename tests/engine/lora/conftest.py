"""Tiny random models with PEFT adapters (random non-zero B), and peft's merged-model tokens."""

from pathlib import Path

import pytest

from kvdeck import LoRARequest
from tests.lora_factory import build_adapter, merged_greedy
from tests.model_factory import build_tiny_model

MAX_NEW = 10
BASE = [(5 * i) % 300 + 3 for i in range(40)]
# Three prompts sharing their first two blocks (32 tokens): a prefix the cache must not share
# between adapters.
PROMPTS = [BASE, BASE[:32] + [7, 8, 9, 10, 11], BASE[:32] + [20, 21, 22, 23, 24, 25, 26]]


class LoRASetup:
    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        self.model_dir = model_dir
        self.adapters = adapters
        self.requests = {name: LoRARequest(name, i + 1, str(path))
                         for i, (name, path) in enumerate(adapters.items())}
        self._expected: dict[tuple[str | None, int], list[int]] = {}

    def expected(self, adapter: str | None, prompt: int) -> list[int]:
        """peft's merged model's greedy tokens for PROMPTS[prompt] (None: the base)."""
        key = (adapter, prompt)
        if key not in self._expected:
            path = None if adapter is None else self.adapters[adapter]
            self._expected[key] = merged_greedy(self.model_dir, path, [PROMPTS[prompt]], MAX_NEW)[0]
        return self._expected[key]


@pytest.fixture(scope="session")
def lora_llama(tmp_path_factory) -> LoRASetup:
    root = tmp_path_factory.mktemp("lora_llama")
    model_dir = build_tiny_model(root / "model", "llama")
    return LoRASetup(model_dir, {
        "sql": build_adapter(model_dir, root / "sql", rank=8, alpha=16, seed=1),
        # Some modules only, another rank, rsLoRA's scaling.
        "code": build_adapter(model_dir, root / "code", rank=4, alpha=8, seed=2, use_rslora=True,
                              targets=("q_proj", "v_proj", "gate_proj", "down_proj")),
    })


@pytest.fixture(scope="session")
def lora_qwen3(tmp_path_factory) -> LoRASetup:
    root = tmp_path_factory.mktemp("lora_qwen3")
    model_dir = build_tiny_model(root / "model", "qwen3")
    return LoRASetup(model_dir, {
        "sql": build_adapter(model_dir, root / "sql", rank=8, alpha=16, seed=3),
        "code": build_adapter(model_dir, root / "code", rank=16, alpha=16, seed=4,
                              targets=("k_proj", "o_proj", "up_proj")),
    })
