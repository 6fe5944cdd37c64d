"""`kvdeck bench decode|throughput|serve --baseline llama.cpp` against a fake llama-server
(tests/bench/fake_llama_server.py): the server is started with the right flags, both sides
get the same prompts, and each pair's ratio comes from the two measured figures."""

import json
import os
import signal
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kvdeck.app.bench.llama_cpp import find_bin_dir
from kvdeck.app.bench.pairs import alternate, common_prefix
from kvdeck.app.bench.throughput import synthetic_requests
from kvdeck.app.cli import main
from tests.bench import fake_llama_server
from tests.bench.fake_llama_server import FAKE_MS_PER_TOKEN, TOKENIZE_IDS, continuation, serve_in_thread

FAKE = Path(fake_llama_server.__file__)


@pytest.fixture
def fake_llama(tmp_path, monkeypatch):
    """A bin folder whose llama-server is the fake, a GGUF path, and the fake's log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    log = tmp_path / "fake.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    yield bin_dir, gguf, log
    # Every server the bench started is gone (each was started with this GGUF path).
    left = subprocess.run(["pgrep", "-f", str(gguf)], capture_output=True, text=True).stdout.split()
    for pid in left:
        os.kill(int(pid), signal.SIGTERM)
    assert not left, "a llama-server outlived the benchmark"


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def llama_flags(bin_dir: Path, gguf: Path) -> list[str]:
    return ["--baseline", "llama.cpp", "--llama-cpp-bin", str(bin_dir), "--llama-cpp-gguf", str(gguf),
            "--llama-cpp-threads", "1"]


def test_decode_pairs_each_run_with_the_servers_timing(tiny_llama_dir, fake_llama, tmp_path):
    bin_dir, gguf, log = fake_llama
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "12",
                 "--output-len", "6", "--repeats", "3", "--kv-cache-memory-gib", "0.01",
                 *llama_flags(bin_dir, gguf), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    decode = result["decode"]
    kvdeck_runs = decode["runs_time_per_output_token_s"]
    assert decode["baseline"]["runs_time_per_output_token_s"] == [FAKE_MS_PER_TOKEN / 1e3] * 3
    assert decode["ratio"]["pairs"] == pytest.approx([FAKE_MS_PER_TOKEN / 1e3 / k for k in kvdeck_runs])
    assert decode["ratio"]["min"] <= decode["ratio"]["median"] <= decode["ratio"]["max"]
    entries = read_log(log)
    argv = entries[0]["argv"]
    assert argv[argv.index("-m") + 1] == str(gguf) and argv[argv.index("-t") + 1] == "1"
    assert argv[argv.index("-ctk") + 1] == "f32"  # kvdeck's fp32 KV, matched
    prompts = [e["body"]["prompt"] for e in entries if e.get("path") == "/completion"]
    assert len(prompts) == 4 and all(p == prompts[0] for p in prompts)  # warm-up + 3 pairs
    assert len(prompts[0]) == 12
    assert result["config"]["baseline"]["command"][0].endswith("llama-server")
    assert 0 <= decode["greedy_tokens_in_common"] <= 6


def test_throughput_sends_kvdecks_requests(tiny_llama_dir, fake_llama, tmp_path):
    bin_dir, gguf, log = fake_llama
    out = tmp_path / "t.json"
    assert main(["bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "5",
                 "--input-len", "8:20", "--output-len", "4:9", "--seed", "4", "--repeats", "2",
                 "--kv-cache-memory-gib", "0.01", *llama_flags(bin_dir, gguf), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    kv, base = result["kvdeck"], result["baseline"]
    assert kv["output_tokens"] == base["output_tokens"]
    assert base["parallel"] == 5
    pairs = result["ratio_pairs"]["pairs"]
    assert len(pairs) == 2 and result["ratio"] == result["ratio_pairs"]["median"]
    assert pairs == pytest.approx([k / b for k, b in zip(kv["runs_output_tokens_per_s"],
                                                         base["runs_output_tokens_per_s"])])
    vocab = json.loads((Path(tiny_llama_dir) / "config.json").read_text())["vocab_size"]
    expected = synthetic_requests(5, (8, 20), (4, 9), vocab, 4)
    sent = [e["body"] for e in read_log(log) if e.get("path") == "/completion"]
    timed = sent[-10:]  # after the warm-up: two runs of the five requests
    assert Counter(tuple(b["prompt"]) for b in timed) == Counter(
        tuple(r.prompt_token_ids) for r in expected * 2)
    assert sorted(b["n_predict"] for b in timed) == sorted(r.output_len for r in expected * 2)


def test_serve_sends_identical_prompts_to_both_servers(fake_llama, tmp_path):
    bin_dir, gguf, log = fake_llama
    ours_log = tmp_path / "ours.jsonl"
    ours, url = serve_in_thread("ours", tokenize_field="prompt", log_path=str(ours_log))
    out = tmp_path / "s.json"
    try:
        assert main(["bench", "serve", "--base-url", url, "--num-prompts", "6", "--input-len", "5:12",
                     "--output-len", "3:6", "--repeats", "2", *llama_flags(bin_dir, gguf),
                     "--out", str(out)]) == 0
    finally:
        ours.shutdown()
    result = json.loads(out.read_text())

    def prompts(path: Path) -> Counter:
        return Counter(tuple(e["body"]["prompt"]) for e in read_log(path)
                       if e.get("path") == "/v1/completions")

    assert prompts(ours_log) == prompts(log) and sum(prompts(log).values()) == 12
    # each repeat sends prompts of its own, so no run meets the last one's in a prompt cache
    assert len(prompts(log)) == 12
    shared = set(TOKENIZE_IDS["prompt"]) & set(TOKENIZE_IDS["content"])
    assert all(set(p) <= shared for p in prompts(log))
    ratio = result["ratio"]
    assert set(ratio) == {"ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_latency_ms_p50",
                          "output_tokens_per_s"}
    runs = result["runs"]
    assert ratio["tpot_ms_p50"]["pairs"] == pytest.approx(
        [r["kvdeck"]["tpot_ms"]["p50"] / r["baseline"]["tpot_ms"]["p50"] for r in runs])
    assert result["kvdeck"]["completed"] == result["baseline"]["completed"] == 6


def test_a_missing_build_or_gguf_is_a_clear_error(tiny_llama_dir, fake_llama, tmp_path, capsys):
    bin_dir, gguf, _ = fake_llama
    with pytest.raises(ValueError, match="benchmarks/llama_cpp.py build"):
        find_bin_dir(str(tmp_path / "nowhere"))
    assert find_bin_dir(str(bin_dir)) == bin_dir
    code = main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "4", "--output-len",
                 "3", "--repeats", "1", "--kv-cache-memory-gib", "0.01", "--baseline", "llama.cpp",
                 "--llama-cpp-bin", str(bin_dir)])
    assert code == 2 and "--llama-cpp-gguf" in capsys.readouterr().err


def test_alternate_takes_turns_and_keeps_pairs():
    order = []
    pairs = alternate(lambda: order.append("k") or len(order), lambda: order.append("b") or -len(order), 4)
    assert order == ["k", "b", "b", "k", "k", "b", "b", "k"]
    assert pairs == [(1, -2), (4, -3), (5, -6), (8, -7)]  # (kvdeck, baseline) whatever went first
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1], [1, 5]) == 1
    assert continuation([1, 2], 3) == [3, 4, 5]
