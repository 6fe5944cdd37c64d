"""Loading: sharded checkpoints, dtype conversion, the hub cache, dummy weights."""

import json
import shutil

import pytest
import torch

from kvdeck import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _tokens(llm, prompt="The quick brown fox"):
    return llm.generate(prompt, GREEDY)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def reference_tokens(tiny_llama_dir):
    return _tokens(LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01))


def test_sharded_checkpoint(tiny_llama_dir, tmp_path, reference_tokens):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    out = tmp_path / "sharded"
    model.save_pretrained(out, max_shard_size="100KB")
    for f in tiny_llama_dir.iterdir():
        if "token" in f.name or f.name == "generation_config.json":
            shutil.copy(f, out / f.name)
    assert len(list(out.glob("*.safetensors"))) > 1
    assert _tokens(LLM(str(out), kv_cache_memory_gib=0.01)) == reference_tokens


def test_bf16_checkpoint_runs_in_bf16_where_the_cpu_does_bf16(tiny_llama_dir, tmp_path):
    import transformers

    from kvdeck.kernels.cpu.linear import bf16_packing_supported

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.bfloat16)
    out = tmp_path / "bf16"
    model.save_pretrained(out)
    for f in tiny_llama_dir.iterdir():
        if "token" in f.name:
            shutil.copy(f, out / f.name)
    llm = LLM(str(out), kv_cache_memory_gib=0.01)
    native = torch.bfloat16 if bf16_packing_supported() else torch.float32  # the CPU default
    assert llm.engine.core.runner.dtype == native
    assert llm.engine.core.model_config.checkpoint_dtype == "bfloat16"
    assert len(_tokens(llm)) == 6
    exact = LLM(str(out), kv_cache_memory_gib=0.01, dtype="float32")
    assert exact.engine.core.runner.dtype == torch.float32
    assert len(_tokens(exact)) == 6


def test_hub_cache_lookup(tiny_llama_dir, tmp_path, monkeypatch, reference_tokens):
    cache = tmp_path / "hub"
    snapshot = cache / "models--kvdeck--tiny" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_llama_dir, snapshot)
    (cache / "models--kvdeck--tiny" / "refs").mkdir(parents=True)
    (cache / "models--kvdeck--tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert _tokens(LLM("kvdeck/tiny", kv_cache_memory_gib=0.01)) == reference_tokens
    with pytest.raises(ValueError, match="kvdeck pull kvdeck/absent"):
        LLM("kvdeck/absent")


def test_dummy_weights_from_a_bare_config(tiny_llama_dir, tmp_path):
    config_only = tmp_path / "cfg"
    config_only.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", config_only / "config.json")
    llm = LLM(str(config_only / "config.json"), load_format="dummy", kv_cache_memory_gib=0.01)
    out = llm.generate([[1, 2, 3, 4]], GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 6 and out.outputs[0].text == ""
    with pytest.raises(ValueError, match="token ids"):
        llm.generate("text needs a tokenizer", GREEDY)


def test_rope_scaling_old_style_config(tiny_llama_dir, tmp_path, reference_tokens):
    """A transformers-4 style config (rope_theta + rope_scaling) loads the same model."""
    old = tmp_path / "old"
    shutil.copytree(tiny_llama_dir, old)
    config = json.loads((old / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (old / "config.json").write_text(json.dumps(config))
    assert _tokens(LLM(str(old), kv_cache_memory_gib=0.01)) == reference_tokens


def test_unsupported_rope_scaling(tiny_llama_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope scaling type 'yarn'"):
        LLM(str(bad))


def test_bfloat16_engine_on_cpu(tiny_llama_dir):
    """dtype='bfloat16' puts every weight and the KV cache in bf16 (norms included)."""
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory_gib=0.01)
    runner = llm.engine.core.runner
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}
    assert runner.k_caches[0].dtype == torch.bfloat16
    assert len(_tokens(llm)) == 6
