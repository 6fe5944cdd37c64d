"""`kvdeck bench throughput` on a tiny model: JSON fields, ratio from measured numbers."""

import json

import pytest

from kvdeck.app.cli import main


def test_throughput_with_hf_baseline(tiny_llama_dir, tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    code = main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "6",
        "--input-len", "8:40", "--output-len", "4:24", "--seed", "3", "--baseline", "hf",
        "--kv-cache-memory-gib", "0.01", "--out", str(out), "--plot", str(plot),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    kv, base = result["kvdeck"], result["baseline"]
    assert result["ratio"] == pytest.approx(kv["output_tokens_per_s"] / base["output_tokens_per_s"])
    assert kv["output_tokens"] == base["output_tokens"]  # same requests, same tokens asked for
    assert kv["output_tokens_per_s"] == pytest.approx(kv["output_tokens"] / kv["elapsed_s"])
    assert 0 < kv["peak_kv_usage"] <= 1
    assert 0 <= kv["kv_waste_at_peak"] < kv["contiguous_kv_waste_at_peak"] < 1
    assert 0 < kv["host_overhead_share"] < 1
    assert kv["kernel_compiles"] == 0 and kv["runs_discarded_for_compiles"] == 0
    host = kv["host_work_per_step_s"]  # each host phase per step, the front-end's included
    assert host["frontend"] > 0 and host["total"] == pytest.approx(
        host["schedule"] + host["prepare_inputs"] + host["update_outputs"] + host["frontend"])
    assert host["total"] * kv["steps"] == pytest.approx(sum(kv["step_time_breakdown_s"].values())
                                                        - kv["step_time_breakdown_s"]["model_and_sampling"])
    assert result["config"]["num_prompts"] == 6 and result["config"]["seed"] == 3
    assert result["environment"]["torch"] and result["command"].startswith("kvdeck bench throughput ")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "ratio (kvdeck / hf" in printed and "front-end" in printed


def test_prefix_cache_hits_on_repeated_prompts_file(tiny_llama_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Paged attention stores keys and values in fixed-size blocks. " * 3 + "\n")
    out = tmp_path / "r.json"
    assert main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "4",
        "--output-len", "4:8", "--prompts-file", str(prompts), "--kv-cache-memory-gib", "0.01",
        "--max-num-seqs", "1", "--out", str(out),
    ]) == 0
    assert json.loads(out.read_text())["kvdeck"]["prefix_cache_hit_rate"] > 0.5


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--input-len", "10", None), ("--input-len", "9:3", "MIN <= MAX"), ("--output-len", "x:y", "MIN:MAX")],
)
def test_bad_ranges(tiny_llama_dir, flag, value, message, capsys):
    argv = ["bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "1",
            "--kv-cache-memory-gib", "0.01", "--output-len", "2:3", flag, value]
    code = main(argv)
    if message is None:
        assert code == 0  # "10" means 10:10
    else:
        assert code == 2 and message in capsys.readouterr().err


def test_repeats_report_the_median_run_of_each_side(tiny_llama_dir, tmp_path):
    out = tmp_path / "r.json"
    assert main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "3",
        "--input-len", "34:50", "--output-len", "4:8", "--baseline", "hf", "--repeats", "3",
        "--kv-cache-memory-gib", "0.01", "--out", str(out),
    ]) == 0
    result = json.loads(out.read_text())
    for side in ("kvdeck", "baseline"):
        runs = result[side]["runs_output_tokens_per_s"]
        assert len(runs) == 3 and result[side]["output_tokens_per_s"] == sorted(runs)[1]
    # Every repeat starts from an empty prefix cache: random prompts never hit.
    assert result["kvdeck"]["prefix_cache_hit_rate"] == 0.0
    assert result["ratio"] == pytest.approx(result["kvdeck"]["output_tokens_per_s"]
                                            / result["baseline"]["output_tokens_per_s"])
    assert result["config"]["repeats"] == 3


def test_repeats_must_be_positive(tiny_llama_dir, capsys):
    assert main(["bench", "throughput", "--model", str(tiny_llama_dir), "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
