"""Fixtures for the model manager: isolated directories, a tiny model, a loopback hub."""

import json
from pathlib import Path

import pytest

from tests.app.fake_hub import FakeHub, FakeRepo
from tests.model_factory import build_tokenizer


def build_tiny_llama(out_dir: Path, *, shard: bool = False, seed: int = 0) -> Path:
    """A random Llama small enough for tests, with dims divisible by AWQ's group size 128."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = len(build_tokenizer(out_dir))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config).to(torch.float16)
    model.save_pretrained(out_dir, max_shard_size="300KB" if shard else "2GB")
    return out_dir


@pytest.fixture(scope="session")
def hub_model_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model", shard=True)


@pytest.fixture(scope="session")
def unsupported_model_dir(hub_model_dir, tmp_path_factory) -> Path:
    """The tiny Llama's files under an architecture kvdeck does not implement."""
    out = tmp_path_factory.mktemp("tiny-other") / "model"
    out.mkdir()
    for p in hub_model_dir.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture
def kvdeck_env(tmp_path, monkeypatch) -> Path:
    """Fresh HF_HOME and KVDECK_HOME; no token, no offline mode."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "HF_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path / "kvdeck-home"))
    monkeypatch.setattr("kvdeck.app.store.download.CHUNK_BYTES", 16 * 1024)  # several chunks per tiny file
    monkeypatch.setattr("kvdeck.app.store.download_progress.REPORT_INTERVAL_S", 0.0)  # report every chunk
    return tmp_path


@pytest.fixture
def hub(kvdeck_env, monkeypatch, hub_model_dir, unsupported_model_dir):
    fake = FakeHub()
    fake.repos["tiny/llama"] = FakeRepo.from_dir(hub_model_dir)
    fake.repos["tiny/gated-llama"] = FakeRepo.from_dir(hub_model_dir, gated=True)
    fake.repos["tiny/gpt2ish"] = FakeRepo.from_dir(unsupported_model_dir)
    fake.start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    yield fake
    fake.stop()
