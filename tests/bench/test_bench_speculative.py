"""`kvdeck bench decode|throughput --speculative-config`: both sides in one run, the speedup
as paired ratios of measured figures, acceptance beside it, greedy outputs compared."""

import json
import statistics

import pytest

from kvdeck.app.bench.grounded import grounded_prompts
from kvdeck.app.cli import main
from kvdeck.engine.frontend.tokenizer import load_tokenizer

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'


def test_decode_comparison(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--workload", "grounded",
                 "--input-len", "40", "--output-len", "24", "--repeats", "3",
                 "--kv-cache-memory-gib", "0.01", "--speculative-config", NGRAM, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    plain, spec = result["baseline"]["runs_time_per_output_token_s"], result["speculative"][
        "runs_time_per_output_token_s"]
    assert len(plain) == len(spec) == 3
    assert result["paired_ratios"] == pytest.approx([p / s for p, s in zip(plain, spec)])
    assert result["ratio"] == pytest.approx(statistics.median(result["paired_ratios"]))
    acc = result["acceptance"]
    assert acc["num_draft_tokens"] > 0 and acc["acceptance_rate"] == pytest.approx(
        acc["num_accepted_tokens"] / acc["num_draft_tokens"])
    assert result["greedy_outputs_identical"] is True
    assert result["config"]["workload"] == "grounded"
    assert result["config"]["engine"]["speculative_config"] == json.loads(NGRAM)
    assert "speculative decode, batch 1" in capsys.readouterr().out


def test_throughput_comparison(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "5",
                 "--input-len", "16:40", "--output-len", "8:16", "--workload", "grounded",
                 "--repeats", "2", "--kv-cache-memory-gib", "0.01", "--speculative-config", NGRAM,
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kvdeck"]["output_tokens"] == result["baseline"]["output_tokens"]
    assert result["ratio"] == pytest.approx(statistics.median(result["paired_ratios"]))
    assert result["acceptance"]["num_drafts"] > 0
    assert main(["bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "1",
                 "--baseline", "hf", "--speculative-config", NGRAM]) == 2
    assert "leave out --baseline hf" in capsys.readouterr().err


def test_grounded_prompts_repeat_their_passage(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir, None, required=True)
    prompts = grounded_prompts(tokenizer, 3, 60, seed=1)
    assert [len(p) for p in prompts] == [60, 60, 60]
    assert prompts == grounded_prompts(tokenizer, 3, 60, seed=1)  # fixed by the seed
    for prompt in prompts:
        head = prompt[-(len(prompt) // 5):]
        assert any(prompt[i : i + len(head)] == head for i in range(len(prompt) - len(head)))
