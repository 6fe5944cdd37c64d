"""`kvdeck plan` on the command line: the issue's question answered before any download, the
JSON report, and bad input as clear errors."""

import json

from kvdeck.app.cli import main

QUESTION = ["plan", "--model", "Qwen3-8B", "--quant", "awq", "--gpu", "RTX 4090", "--context",
            "8192", "--users", "16", "--output-len", "64"]


def test_the_8b_awq_on_a_24_gb_card_question_gets_a_verdict(capsys):
    assert main(QUESTION + ["--try", "kv_cache_dtype=fp8"]) == 0
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-1]
    # 16 users at once, each a full 8k context: 13.1 fit in the pool, so some wait or preempt.
    assert verdict.startswith(("does not fit", "fits this workload")), out
    assert "13.1 full 8192-token contexts" in verdict
    assert "RTX 4090: 24 GiB x 0.9" in out and "kv_cache_dtype=fp8" in out


def test_piped_the_table_keeps_every_cell_whole(capsys, monkeypatch):
    """Not a terminal (a pipe, a file, capsys), the report is not cut at 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(QUESTION + ["--try", "kv_cache_dtype=fp8", "--try", "max_num_seqs=8"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out, out
    header = next(line for line in out.splitlines() if "choice" in line and "TTFT" in line)
    assert header.split() == ["choice", "pool", "TTFT", "ITL", "KV", "peak", "preempt", "max",
                              "run", "tok/s", "hit"]


def test_json_report_has_every_choice(capsys):
    assert main(QUESTION + ["--json", "--try", "max_num_seqs=8", "--try", "prefix_caching=off"]) == 0
    report = json.loads(capsys.readouterr().out)
    labels = [s["label"] for s in report["summaries"]]
    assert labels == ["base", "max_num_seqs=8", "prefix_caching=off"]
    base, fewer, _ = report["summaries"]
    assert base["requests"] == 16 and base["finished"] == 16
    assert fewer["max_running"] <= 8 < base["max_running"]
    assert set(base["ttft_s"]) == {"p50", "p90", "p99"}
    assert report["verdict"]


def test_bad_input_is_a_clear_error(capsys, tmp_path):
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "RTX 9999"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'RTX 9999'" in err and "RTX 4090" in err and "H100" in err
    assert main(["plan", "--model", "NoSuchModel-7B", "--gpu", "L4"]) == 2
    assert "unknown model 'NoSuchModel-7B'" in capsys.readouterr().err
    text = tmp_path / "notes.txt"
    text.write_text("not a recording\n")
    assert main(["plan", str(text)]) == 2
    assert "is not a kvdeck recording" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "missing.kvrec")]) == 2
    assert "no such recording file" in capsys.readouterr().err
    assert main(QUESTION + ["--try", "block_sise=32"]) == 2
    assert "'block_sise=32' is not KEY=VALUE" in capsys.readouterr().err
    assert main(["plan", "--model", "Qwen3-8B", "--users", "2"]) == 2  # no pool, no cost model
    assert "no KV pool size" in capsys.readouterr().err
    assert main(QUESTION + ["--kv-cache-dtype", "fp4"]) == 2
    assert "unknown KV dtype 'fp4'" in capsys.readouterr().err
    assert main(QUESTION[:-6] + ["--context", "65536", "--users", "2"]) == 2
    assert "exceeds Qwen3-8B's max_position_embeddings 40960" in capsys.readouterr().err
    assert main(["plan", "--model", "Qwen3-8B", "--gpu", "L4", "--quant", "awq", "--context", "40960",
                 "--num-blocks", "100", "--users", "2"]) == 2
    assert "needs 2560 blocks and the pool holds 100" in capsys.readouterr().err
    assert main(["plan", "--model", "Qwen3-32B", "--gpu", "RTX 4090", "--users", "2"]) == 2
    assert "does not fit on RTX 4090" in capsys.readouterr().err


def test_calibrate_fits_step_costs_to_the_real_engine_here(capsys):
    assert main(["plan", "--calibrate", "--num-blocks", "60", "--users", "4", "--prompt-len", "64",
                 "--output-len", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    base = report["summaries"][0]
    assert "a calibration run of demo here" in base["cost_model"]
    assert base["finished"] == 4 and 0 < base["ttft_s"]["p50"] < 5
