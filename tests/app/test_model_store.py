"""The store's list: what counts as a complete model, and what it says about it."""

import json
import os
import shutil

import pytest

from kvdeck.app.store import local_models, paths, registry
from kvdeck.app.store.inspect import InvalidModelError, read_safetensors_header


def _as_hf_snapshot(src, repo_id: str, commit: str = "a" * 40):
    """Lay a model out as huggingface_hub does (blobs + symlinked snapshot), as another tool would."""
    repo = paths.repo_cache_folder(repo_id)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        blob = repo / "blobs" / f"{i:040d}"
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_paths_follow_environment(kvdeck_env, monkeypatch):
    assert paths.hf_hub_cache() == kvdeck_env / "hf-home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(kvdeck_env / "elsewhere"))
    assert paths.hf_hub_cache() == kvdeck_env / "elsewhere"
    assert paths.store_dir() == kvdeck_env / "kvdeck-home" / "models"
    assert paths.hf_token() is None
    (kvdeck_env / "hf-home").mkdir()
    (kvdeck_env / "hf-home" / "token").write_text("hf_from_file\n")
    assert paths.hf_token() == "hf_from_file"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert paths.hf_token() == "hf_from_env"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert paths.hf_endpoint() == "http://127.0.0.1:9"


def test_snapshot_from_another_tool_is_listed_with_its_facts(kvdeck_env, hub_model_dir):
    snapshot = _as_hf_snapshot(hub_model_dir, "org/tiny")
    [model] = local_models.list_models()
    assert (model.name, model.source, model.path, model.commit) == (
        "org/tiny", "hf-cache", snapshot, "a" * 40)
    assert model.architecture == "LlamaForCausalLM" and model.supported
    assert model.dtype == "float16" and model.quantization is None and not model.verified
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hub_model_dir, dtype=torch.float16)
    assert model.num_params == sum(p.numel() for p in hf.parameters())
    assert model.size_bytes == sum(f.stat().st_size for f in hub_model_dir.iterdir())
    assert local_models.free_disk_bytes() > 0


@pytest.mark.parametrize("damage", ["truncate", "drop_shard", "bad_config", "bad_header"])
def test_incomplete_or_corrupt_snapshot_is_not_listed(kvdeck_env, hub_model_dir, damage):
    snapshot = _as_hf_snapshot(hub_model_dir, "org/tiny")
    shard = snapshot / "model-00002-of-00003.safetensors"
    blob = shard.resolve()
    if damage == "truncate":
        with open(blob, "r+b") as f:
            f.truncate(blob.stat().st_size - 10)
    elif damage == "drop_shard":
        shard.unlink()
    elif damage == "bad_config":
        (snapshot / "config.json").resolve().write_text("{not json")
    else:
        data = bytearray(blob.read_bytes())
        data[8:12] = b"\xff\xff\xff\xff"
        blob.write_bytes(bytes(data))
    assert local_models.list_models() == []


def test_pending_download_is_not_listed_even_if_complete(kvdeck_env, hub_model_dir):
    _as_hf_snapshot(hub_model_dir, "org/tiny")
    registry.mark_pending("org/tiny", "main", "a" * 40)
    assert local_models.list_models() == []
    assert [p.repo_id for p in local_models.pending_downloads()] == ["org/tiny"]
    registry.mark_verified(registry.hf_key("org/tiny", "a" * 40),
                           {"repo_id": "org/tiny", "commit": "a" * 40})  # fmt: skip
    [model] = local_models.list_models()
    assert model.verified and local_models.pending_downloads() == []


def test_store_model_and_awq_parameter_count(kvdeck_env, hub_model_dir):
    import torch
    from safetensors.torch import save_file

    target = paths.store_dir() / "fake-awq"
    shutil.copytree(hub_model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (target / "config.json").write_text(json.dumps(config))
    for f in target.glob("*.safetensors*"):
        f.unlink()
    save_file({
        "model.layers.0.mlp.up_proj.qweight": torch.zeros(128, 32, dtype=torch.int32),
        "model.layers.0.mlp.up_proj.qzeros": torch.zeros(1, 32, dtype=torch.int32),
        "model.layers.0.mlp.up_proj.scales": torch.zeros(1, 256, dtype=torch.float16),
        "model.norm.weight": torch.zeros(128, dtype=torch.float16),
    }, str(target / "model.safetensors"))  # fmt: skip
    [model] = local_models.list_models()
    assert (model.name, model.source, model.quantization) == ("fake-awq", "store", "awq-int4")
    assert model.num_params == 128 * 256 + 128
    local_models.delete_model("fake-awq")
    assert local_models.list_models() == [] and not target.exists()
    assert [p.name for p in paths.store_dir().iterdir()] == []


def test_safetensors_header_checks(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(InvalidModelError, match="truncated"):
        read_safetensors_header(bad)
    bad.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(InvalidModelError, match="header length"):
        read_safetensors_header(bad)
