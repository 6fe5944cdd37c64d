"""GGUF models in Ollama's and LM Studio's stores: listed by `kvdeck models`, imported by name, run."""

import hashlib
import json
import shutil

import pytest

from kvdeck.app.cli import main
from kvdeck.app.store import local_models
from kvdeck.app.store.gguf.discovery import find_importable, parse_ollama_name
from kvdeck.app.store.gguf.header import GGUFImportError
from tests.app.gguf_factory import Q, build_hf_model, write_gguf, write_header_only_gguf

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("discovery")
    hf_dir = build_hf_model(root / "hf")
    return {
        "hf": hf_dir,
        "q8_0": write_gguf(hf_dir, root / "tiny.Q8_0.gguf", Q.Q8_0),
        "q4_0": write_gguf(hf_dir, root / "tiny.Q4_0.gguf", Q.Q4_0),
        "gpt2": write_header_only_gguf(root / "gpt2.gguf", "gpt2"),
    }


def _add_ollama_model(models_dir, namespace_path: str, tag: str, gguf) -> str:
    """A manifest and its blobs, laid out as `ollama pull` leaves them."""
    blobs = models_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    layers = []
    for media_type, data in (("model", gguf.read_bytes()), ("template", b"{{ .Prompt }}")):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / f"sha256-{digest}").write_bytes(data)
        layers.append({"mediaType": f"application/vnd.ollama.image.{media_type}",
                       "digest": f"sha256:{digest}", "size": len(data)})  # fmt: skip
    manifest = models_dir / "manifests" / namespace_path / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": layers[1]["digest"], "size": 1}, "layers": layers,
    }))  # fmt: skip
    return layers[0]["digest"].replace(":", "-")


@pytest.fixture
def other_stores(kvdeck_env, monkeypatch, tiny_ggufs):
    ollama = kvdeck_env / "ollama-models"
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("HOME", str(kvdeck_env / "home"))
    blob = _add_ollama_model(ollama, "registry.ollama.ai/library/tiny", "q8", tiny_ggufs["q8_0"])
    _add_ollama_model(ollama, "registry.ollama.ai/someone/other", "latest", tiny_ggufs["gpt2"])
    # a manifest whose blob was never fetched, as an interrupted pull leaves it
    _add_ollama_model(ollama, "registry.ollama.ai/library/broken", "latest", tiny_ggufs["q4_0"])
    for path in (ollama / "blobs").iterdir():
        if path.read_bytes() == tiny_ggufs["q4_0"].read_bytes():
            path.unlink()
    lmstudio = kvdeck_env / "home" / ".lmstudio" / "models" / "someone" / "tiny-GGUF"
    lmstudio.mkdir(parents=True)
    shutil.copyfile(tiny_ggufs["q4_0"], lmstudio / "tiny.Q4_0.gguf")
    shutil.copyfile(tiny_ggufs["q4_0"], lmstudio / "mmproj-tiny-f16.gguf")  # a vision projector: skipped
    return {"ollama": ollama, "blob": ollama / "blobs" / blob, "lmstudio": lmstudio / "tiny.Q4_0.gguf"}


def test_found_listed_imported_and_chatted_with(other_stores, tiny_ggufs, capsys):
    found = {item.ref: item for item in find_importable()}
    assert set(found) == {"ollama:tiny:q8", "ollama:someone/other:latest", str(other_stores["lmstudio"])}
    tiny = found["ollama:tiny:q8"]
    assert (tiny.name, tiny.source, tiny.path, tiny.architecture, tiny.quantization) == (
        "tiny-q8", "ollama", other_stores["blob"], "llama", "Q8_0")
    assert tiny.size_bytes == tiny_ggufs["q8_0"].stat().st_size and tiny.problem is None
    assert found["ollama:someone/other:latest"].problem == "architecture gpt2 is not supported"
    lm = found[str(other_stores["lmstudio"])]
    assert (lm.source, lm.name, lm.quantization, lm.problem) == ("lmstudio", "tiny.Q4_0", "Q4_0", None)

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "no local models" in out and "importable GGUF models" in out
    row = next(line for line in out.splitlines() if line.startswith("ollama:tiny:q8"))
    assert row.split()[1:3] == ["llama", "Q8_0"] and row.split()[-2:] == ["ollama", "importable"]

    assert main(["import", "ollama:tiny:q8"]) == 0
    assert "imported tiny-q8 (LlamaForCausalLM" in capsys.readouterr().out
    model = local_models.find_model("tiny-q8")
    assert model.origin == "ollama:tiny:q8" and model.dtype == "bfloat16"
    assert main(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in data["models"]] == ["tiny-q8"]
    listed = {i["ref"]: i for i in data["importable"]}
    assert listed["ollama:tiny:q8"]["imported_as"] == "tiny-q8"
    assert listed["ollama:someone/other:latest"]["importable"] is False

    from transformers import AutoTokenizer

    from kvdeck import LLM, SamplingParams

    llm = LLM(str(model.path), kv_cache_memory_gib=0.01)
    messages = [{"role": "user", "content": "The quick brown fox"}]
    [out] = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    original = AutoTokenizer.from_pretrained(tiny_ggufs["hf"])
    rendered = original.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert out.prompt_token_ids == rendered
    assert len(out.outputs[0].token_ids) == 8


def test_ollama_errors_are_clear(other_stores, capsys):
    assert main(["import", "ollama:tiny:missing"]) == 1
    assert "no such model in Ollama's store" in capsys.readouterr().err
    assert main(["import", "ollama:broken"]) == 1
    assert "missing (an unfinished pull?)" in capsys.readouterr().err
    assert main(["import", "ollama:someone/other"]) == 1
    assert "architecture 'gpt2' is not supported" in capsys.readouterr().err
    assert local_models.list_models() == []


def test_ollama_names():
    assert parse_ollama_name("llama3.2") == ("registry.ollama.ai", "library", "llama3.2", "latest")
    assert parse_ollama_name("me/m:7b") == ("registry.ollama.ai", "me", "m", "7b")
    assert parse_ollama_name("host.io/me/m:1") == ("host.io", "me", "m", "1")
    for bad in ("", "a/../b", "a/b/c/d", ":tag"):
        with pytest.raises(GGUFImportError, match="not an Ollama model name"):
            parse_ollama_name(bad)
