import os
from pathlib import Path

import pytest
import torch

from tests.model_factory import build_tokenizer


def build_group128_llama(out_dir: Path, seed: int = 0) -> Path:
    """A tiny random Llama whose dims fit AWQ's group of 128 (the shared tiny models do not)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.1, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def group128_llama_dir(tmp_path_factory) -> Path:
    return build_group128_llama(tmp_path_factory.mktemp("quant") / "llama-g128")


@pytest.fixture(scope="module")
def marlin():
    """The repacked W4A16 kernel's module (kernels/triton/w4a16_marlin.py), compiled on a GPU or
    interpreted (tests/conftest.py sets TRITON_INTERPRET=1 for the suite, so CI never skips;
    the guard is for a test file run without it on a machine with no GPU)."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernel needs a GPU or TRITON_INTERPRET=1")
    from kvdeck.kernels.triton import w4a16_marlin

    return w4a16_marlin
