"""`kvdeck bench decode`: batch-1 decode time against the memory-bandwidth roofline."""

import json
import statistics

import pytest
import torch

from kvdeck import LLM
from kvdeck.app.bench.decode import copy_bandwidth
from kvdeck.app.cli import main


def test_decode_json_holds_the_roofline_arithmetic(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "12",
                 "--output-len", "6", "--repeats", "3", "--kv-cache-memory-gib", "0.01",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    decode = result["decode"]
    assert len(decode["runs_time_per_output_token_s"]) == 3
    assert decode["time_per_output_token_s"] == statistics.median(decode["runs_time_per_output_token_s"])
    assert decode["output_tokens_per_s"] == pytest.approx(1 / decode["time_per_output_token_s"])
    assert decode["mean_context_tokens"] == 12 + 6 / 2
    assert decode["bytes_per_token"] == pytest.approx(
        decode["weight_bytes_per_token"]
        + decode["kv_bytes_per_context_token"] * decode["mean_context_tokens"])
    assert decode["roofline_time_per_output_token_s"] == pytest.approx(
        decode["bytes_per_token"] / decode["copy_bandwidth_bytes_per_s"])
    assert decode["roofline_fraction"] == pytest.approx(
        decode["roofline_time_per_output_token_s"] / decode["time_per_output_token_s"])
    assert 0 < decode["roofline_fraction"] < 1
    assert result["config"]["input_len"] == 12 and result["command"].startswith("kvdeck bench decode ")
    assert "of the roofline" in capsys.readouterr().out


def test_decode_takes_a_model_by_its_store_name(listed_tiny_llama, capsys):
    # As `kvdeck --model NAME` does: the name `kvdeck models` lists.
    assert main(["bench", "decode", "--model", listed_tiny_llama, "--input-len", "8",
                 "--output-len", "4", "--repeats", "1", "--kv-cache-memory-gib", "0.01"]) == 0
    assert "of the roofline" in capsys.readouterr().out


@pytest.mark.parametrize("family", ["llama", "qwen3"])  # untied and tied output heads
def test_weight_and_kv_bytes_match_the_checkpoint(tiny_model_dirs, family):
    import transformers

    path = tiny_model_dirs[family]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = hf.config
    llm = LLM(str(path), kv_cache_memory_gib=0.01)
    embedding = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    assert llm.engine.info.weight_bytes_per_token == (hf.num_parameters() - embedding) * 4
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert llm.engine.info.kv_bytes_per_token == (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4)


def test_copy_bandwidth_is_a_plausible_rate():
    assert 1e8 < copy_bandwidth(torch.device("cpu")) < 1e13


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--output-len", "1", "--output-len must be at least 2"),
    ("--input-len", "0", "--input-len must be positive"),
    ("--repeats", "0", "--repeats must be >= 1"),
])
def test_bad_decode_arguments(tiny_llama_dir, capsys, flag, value, message):
    code = main(["bench", "decode", "--model", str(tiny_llama_dir), "--kv-cache-memory-gib", "0.01",
                 "--input-len", "4", "--output-len", "4", flag, value])
    assert code == 2 and message in capsys.readouterr().err
