"""Quantise jobs with the real AWQ quantiser (quant/) in a background process."""

import os
import shutil
import threading

import pytest

from kvdeck.app.cli import main as kvdeck
from kvdeck.app.jobs.compare import CompareProgress, heldout_text_for, start_compare
from kvdeck.app.jobs.quantize import (
    QuantizeOptions,
    QuantizeProgress,
    remove_orphaned_staging,
    start_quantize,
)
from kvdeck.app.store import local_models, paths, registry
from kvdeck.assets import calibration_text, demo_model_dir

pytestmark = pytest.mark.timeout(180)

FAST = QuantizeOptions(num_samples=4, seq_len=64, device="cpu", num_threads=1)
HELDOUT = demo_model_dir() / "heldout.txt"


@pytest.fixture
def stored_source(kvdeck_env, hub_model_dir):
    """The tiny fp16 Llama placed in kvdeck's store, as a listed model."""
    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")
    model = local_models.find_model("tiny-llama")
    assert model is not None and model.quantization is None
    return model


def _leftovers() -> list[str]:
    staging = paths.staging_dir()
    hidden = [p.name for p in paths.store_dir().iterdir() if p.name.startswith(".")]
    return ([p.name for p in staging.iterdir()] if staging.exists() else []) + [
        h for h in hidden if h != ".staging"
    ]


@pytest.mark.slow
def test_quantize_job_reports_monotone_progress_and_registers(stored_source):
    seen: list[QuantizeProgress] = []
    job = start_quantize(stored_source, options=FAST, on_progress=seen.append)
    result = job.wait(timeout=150)

    assert result is not None and result.name == "tiny-llama-awq" and result.source == "store"
    assert result.quantization == "awq-int4" and result.verified and result.origin == "tiny-llama"
    assert result.num_params == stored_source.num_params  # int4 weights still count as params
    assert result.size_bytes < stored_source.size_bytes
    layers = [p.layer for p in seen if p.phase == "quantizing"]
    assert layers == sorted(layers) and layers[-1] == 2 and seen[-1].phase == "done"
    # Progress starts at once and moves inside the layers, not only when each ends.
    messages = [p.message for p in seen]
    assert messages[0] == "reading the model's config"
    assert "layer 1/2: recording the linears' inputs" in messages
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert [m.name for m in local_models.list_models()] == ["tiny-llama", "tiny-llama-awq"]
    assert registry.store_key("tiny-llama-awq") in registry.read()["verified"]
    assert _leftovers() == []
    with pytest.raises(ValueError, match="already quantised"):
        start_quantize(result, options=FAST)
    with pytest.raises(ValueError, match="already exists"):
        start_quantize(stored_source, options=FAST)

    # Compare size and perplexity with the original, in a background process, on text
    # neither was tuned on (tiny-llama ships none, so one is given).
    with pytest.raises(ValueError, match="heldout.txt"):
        start_compare(stored_source, result)
    with pytest.raises(ValueError, match="calibration text"):
        start_compare(stored_source, result, text_file=str(calibration_text()))
    messages: list[str] = []
    progress: list[CompareProgress] = []
    comparison = start_compare(stored_source, result, text_file=str(HELDOUT), seq_len=64,
                               max_windows=4, device="cpu", num_threads=1,
                               on_message=messages.append,
                               on_progress=progress.append).wait(timeout=120)
    assert comparison.size_ratio == stored_source.size_bytes / result.size_bytes > 1.5
    assert comparison.num_tokens == 4 * 63 and messages[0] == "measuring the original"
    fractions = [p.fraction for p in progress]
    # start, a report per window of each model (4 + 4), the half-way note, the end
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) == 11
    expected = _reference_perplexity(stored_source.path, comparison.text_file)
    assert comparison.original_ppl == pytest.approx(expected, rel=1e-4)
    # A random tiny model predicts near-uniformly; INT4 must not move that much.
    assert comparison.quantized_ppl == pytest.approx(comparison.original_ppl, rel=0.1)
    assert "smaller; perplexity" in comparison.summary()


def _reference_perplexity(model_dir, text_file) -> float:
    """exp(mean NLL) over the first 4 windows of 64 tokens, with transformers' own loss."""
    import math
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(Path(text_file).read_text(), add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    losses = []
    with torch.no_grad():
        for i in range(4):
            window = torch.tensor([ids[i * 64:(i + 1) * 64]])
            losses.append(model(window, labels=window).loss.item())
    return math.exp(sum(losses) / len(losses))


@pytest.mark.slow
def test_cancelled_job_leaves_nothing_behind(stored_source):
    started = threading.Event()

    def on_progress(p: QuantizeProgress) -> None:
        if p.phase == "quantizing":
            started.set()

    job = start_quantize(stored_source, options=FAST, on_progress=on_progress)
    assert started.wait(120), "the worker never reported progress"
    job.cancel()
    assert job.done and job.wait(0) is None and job.progress.phase == "cancelled"
    assert not job.background.process_alive
    assert [m.name for m in local_models.list_models()] == ["tiny-llama"]
    assert not (paths.store_dir() / "tiny-llama-awq").exists()
    assert _leftovers() == []
    assert registry.store_key("tiny-llama-awq") not in registry.read()["verified"]


@pytest.mark.slow
def test_failed_job_reports_error_and_leaves_nothing(stored_source):
    job = start_quantize(stored_source, options=QuantizeOptions(seq_len=10**6, num_samples=1,
                                                                device="cpu", num_threads=1))
    with pytest.raises(RuntimeError, match="seq_len"):
        job.wait(timeout=120)
    assert job.progress.phase == "failed"
    assert [m.name for m in local_models.list_models()] == ["tiny-llama"] and _leftovers() == []


def test_bad_options_are_value_errors(stored_source):
    with pytest.raises(ValueError, match="num_samples"):
        start_quantize(stored_source, options=QuantizeOptions(num_samples=0))
    with pytest.raises(ValueError, match="name"):
        start_quantize(stored_source, name="../evil", options=FAST)
    with pytest.raises(ValueError, match="no local model"):
        start_quantize("nope", options=FAST)


def test_orphaned_staging_of_a_dead_process_is_removed(kvdeck_env):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphan = paths.staging_dir() / "x-awq-0000"
    (orphan / "x-awq").mkdir(parents=True)
    (orphan / "owner.pid").write_text(dead)
    live = paths.staging_dir() / "y-awq-0000"
    live.mkdir()
    (live / "owner.pid").write_text(str(os.getpid()))
    assert remove_orphaned_staging() == [orphan]
    assert not orphan.exists() and live.exists()


def test_the_bundled_models_heldout_text_is_the_default(kvdeck_env):
    [demo] = local_models.bundled_models()
    quantized = local_models.LocalModel("demo-awq", kvdeck_env, "store", "LlamaForCausalLM", 1,
                                        "float16", "awq-int4", 1, True)
    assert heldout_text_for(demo, quantized) == HELDOUT


@pytest.mark.slow
def test_cli_quantize_writes_into_the_store_for_the_models_screen(kvdeck_env, hub_model_dir,
                                                                  capsys):
    folder = kvdeck_env / "elsewhere" / "tiny"
    shutil.copytree(hub_model_dir, folder)
    assert kvdeck(["quantize", str(folder), "--num-samples", "2", "--seq-len", "32",
                   "--device", "cpu"]) == 0
    assert "added to kvdeck's model store as tiny-awq" in capsys.readouterr().out
    model = local_models.find_model("tiny-awq")
    assert model is not None and model.source == "store" and model.quantization == "awq-int4"
    assert model.origin == "tiny" and model.origin_path == str(folder.resolve())
    assert not [p for p in folder.parent.iterdir() if p.name != "tiny"]  # nothing beside it
    assert _leftovers() == []
    assert kvdeck(["quantize", str(folder), "--num-samples", "2", "--seq-len", "32"]) == 1
    assert "already exists" in capsys.readouterr().err


def test_cli_progress_names_the_method(kvdeck_env, hub_model_dir, capsys):
    """An RTN run's progress says RTN, not AWQ (the bar, each step's line)."""
    from kvdeck.app.cli.quantize import progress_bar, step_line
    from kvdeck.quant.awq_quantizer import QuantizeStep

    assert progress_bar(0.5).startswith("AWQ [") and progress_bar(0.5, "rtn").startswith("RTN [")
    assert step_line(QuantizeStep(1.0, "writing the checkpoint", 3.0), "rtn").startswith("RTN [")
    folder = kvdeck_env / "elsewhere" / "tiny"
    shutil.copytree(hub_model_dir, folder)
    assert kvdeck(["quantize", str(folder), "--method", "rtn", "--device", "cpu",
                   "--out", str(kvdeck_env / "tiny-rtn")]) == 0
    err = capsys.readouterr().err
    assert "with RTN" in err and "RTN [" in err and "AWQ" not in err


def test_options_refuse_an_unknown_method(stored_source):
    with pytest.raises(ValueError, match="method must be one of"):
        start_quantize(stored_source, options=QuantizeOptions(method="gptq"))
