"""`kvdeck quantize` / `kvdeck eval-ppl`, the checkpoint writer, and their error paths."""

import errno
import json
from types import SimpleNamespace

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.app.cli import main as kvdeck
from kvdeck.quant import awq_pipeline, checkpoint
from kvdeck.quant.awq_pipeline import QuantizeJob, run_quantize_job
from kvdeck.quant.checkpoint import write_awq_checkpoint
from kvdeck.quant.hf_int4 import load_awq_into_transformers, read_safetensors
from tests.quant.awq_reference import reference_dequantize

TENSORS = {"a.qweight": torch.ones(4, 2, dtype=torch.int32), "b.weight": torch.zeros(3)}
CONFIG = {"model_type": "llama", "dtype": "float32"}
AWQ_SUFFIXES = (".qweight", ".qzeros", ".scales")


def test_quantize_then_load_everywhere(group128_llama_dir, tmp_path, capsys):
    out = tmp_path / "llama-awq"
    code = kvdeck(["quantize", str(group128_llama_dir), "--method", "awq", "--out", str(out),
                   "--num-samples", "4", "--seq-len", "64", "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "layer 2/2" in captured.err and "ETA" in captured.err
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
        "version": "gemm",
    }
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]

    # The engine and the transformers host run the same INT4 weights (both on the reference
    # product here; the CPU kernel's int8 activations are held to it in tests/kernels).
    prompt = [5, 6, 7, 8]
    llm = LLM(model=str(out), device="cpu", dtype="float32", max_model_len=64,
              quantization="awq", attention_backend="torch")
    tokens = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0,
                                                   ignore_eos=True))[0].outputs[0].token_ids
    hf = load_awq_into_transformers(out, backend="torch")
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                           eos_token_id=None)[0, len(prompt):].tolist()
    assert tokens == expected

    # The layout is AutoAWQ's: the independent reader computes the same logits, and those
    # still follow the fp model's (a sanity bound for a random model; quality is measured
    # in test_awq_quality.py).
    from transformers import AutoModelForCausalLM

    packed = read_safetensors(out)
    reference = AutoModelForCausalLM.from_pretrained(group128_llama_dir, dtype=torch.float32)
    ids = torch.tensor([list(range(10, 42))])
    with torch.no_grad():
        fp_logits = reference(ids).logits
        state = {k: v.float() for k, v in packed.items() if not k.endswith(AWQ_SUFFIXES)}
        for name in [k for k in packed if k.endswith(".qweight")]:
            prefix = name[: -len(".qweight")]
            state[f"{prefix}.weight"] = reference_dequantize(
                packed[name], packed[f"{prefix}.qzeros"], packed[f"{prefix}.scales"], 128
            ).t().float()
        reference.load_state_dict(state, strict=True)
        torch.testing.assert_close(hf(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
        cosine = torch.nn.functional.cosine_similarity(
            hf(ids).logits.flatten(), fp_logits.flatten(), dim=0)
        # the CPU INT4 kernel (int8 activations) stays close to the reference product
        native = load_awq_into_transformers(out)(ids).logits
        same = torch.nn.functional.cosine_similarity(native.flatten(), hf(ids).logits.flatten(), dim=0)
    assert float(cosine) > 0.8 and float(same) > 0.999

    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    for model_dir in (group128_llama_dir, out):
        assert kvdeck(["eval-ppl", str(model_dir), "--file", str(text), "--seq-len", "64",
                       "--device", "cpu"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "perplexity:" in line]
    assert len(lines) == 2 and "AWQ INT4" in lines[1]
    fp_ppl, awq_ppl = (float(line.split()[1]) for line in lines)
    assert 1.0 < fp_ppl and 1.0 < awq_ppl


def test_quantize_refuses_unsupported_models(tiny_llama_dir, tmp_path, capsys):
    # The shared tiny Llama has hidden_size 64: not a multiple of the group of 128 (asked for;
    # by default the group size is the largest that fits, 64 here).
    code = kvdeck(["quantize", str(tiny_llama_dir), "--group-size", "128", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "hidden_size = 64 is not divisible by the AWQ group size 128" in capsys.readouterr().err
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        run_quantize_job(QuantizeJob(source=str(gpt2), out_dir=str(tmp_path / "y")))
    with pytest.raises(ValueError, match="neither a directory nor in the local hub cache: the "
                                         "path does not exist"):
        run_quantize_job(QuantizeJob(source=str(tmp_path / "missing")))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_quantize_refuses_existing_output_and_missing_calibration(group128_llama_dir, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ValueError, match="already exists"):
        run_quantize_job(QuantizeJob(source=str(group128_llama_dir), out_dir=str(taken)))
    with pytest.raises(ValueError, match="calibration file"):
        run_quantize_job(QuantizeJob(source=str(group128_llama_dir), out_dir=str(tmp_path / "o"),
                                     calib_file=str(tmp_path / "nope.txt")))


def test_interrupted_quantize_writes_nothing(group128_llama_dir, tmp_path, monkeypatch, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(awq_pipeline, "quantize_awq", interrupt)
    out = tmp_path / "out"
    assert kvdeck(["quantize", str(group128_llama_dir), "--out", str(out), "--num-samples", "2",
                   "--seq-len", "32"]) == 130
    assert "interrupted; nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_writer_is_atomic_when_the_disk_fills(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    with pytest.raises(OSError, match="disk full") as info:
        write_awq_checkpoint(tmp_path / "out", TENSORS, CONFIG, None)
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_writer_is_atomic_when_interrupted(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_awq_checkpoint(tmp_path / "out", TENSORS, CONFIG, None)
    assert list(tmp_path.iterdir()) == []


def test_short_free_space_is_refused_before_any_work(group128_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: SimpleNamespace(free=10))
    with pytest.raises(OSError, match="not enough disk space"):
        write_awq_checkpoint(tmp_path / "out", TENSORS, CONFIG, None)
    monkeypatch.setattr(awq_pipeline, "quantize_awq", lambda *a, **k: pytest.fail("ran AWQ"))
    with pytest.raises(OSError, match="not enough disk space"):
        run_quantize_job(QuantizeJob(source=str(group128_llama_dir), out_dir=str(tmp_path / "o")))
    assert list(tmp_path.iterdir()) == []


def test_writer_shards_large_checkpoints_and_cleans_stale_partials(tmp_path, monkeypatch):
    stale = tmp_path / ".out.partial-999999999"
    stale.mkdir()
    monkeypatch.setattr(checkpoint, "MAX_SHARD_BYTES", 16)
    out = write_awq_checkpoint(tmp_path / "out", TENSORS, CONFIG, None, group_size=64)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(TENSORS)
    assert len(set(index["weight_map"].values())) == 2
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 64 and config["dtype"] == "float16"
    assert not stale.exists()


def test_quantize_takes_a_listed_models_name_with_out(listed_tiny_llama, tmp_path, capsys):
    # `kvdeck quantize NAME --out DIR`: NAME as `kvdeck models` lists it, not only a folder.
    out = tmp_path / "out"
    assert kvdeck(["quantize", listed_tiny_llama, "--method", "rtn", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "awq"
    assert kvdeck(["quantize", "no-such-model", "--method", "rtn", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err  # a hub id: pulling it is the way
    assert "neither a directory nor in the local hub cache" in err and "kvdeck pull" in err


def test_eval_ppl_takes_demo_and_a_listed_models_name(listed_tiny_llama, tmp_path, capsys):
    # As `kvdeck --model` does: `demo` is the bundled model, a store name its folder.
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    for model in ("demo", listed_tiny_llama):
        assert kvdeck(["eval-ppl", model, "--file", str(text), "--max-windows", "1"]) == 0
        assert capsys.readouterr().out.startswith("perplexity: ")
    assert kvdeck(["eval-ppl", "no-such-model", "--file", str(text)]) == 2
    assert "kvdeck pull" in capsys.readouterr().err
