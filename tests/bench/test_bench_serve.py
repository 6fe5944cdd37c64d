"""`kvdeck bench serve` against a live `kvdeck --serve` on loopback."""

import json

import pytest

from kvdeck.app.cli import main
from tests.serve.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    live = start_server(tiny_llama_dir, tmp_path_factory.mktemp("bench_serve_logs"))
    yield live
    stop_server(live)


@pytest.mark.timeout(300)
def test_serve_benchmark_fields(server, tmp_path):
    out, plot = tmp_path / "s.json", tmp_path / "s.png"
    code = main([
        "bench", "serve", "--base-url", server.base_url, "--num-prompts", "12",
        "--input-len", "8:40", "--output-len", "4:16", "--request-rate", "20",
        "--max-concurrency", "6", "--seed", "1", "--out", str(out), "--plot", str(plot),
        "--api-key", "sk-not-for-the-json",  # a server without a key ignores one
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 12 and result["failed"] == 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        stats = result[key]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"]
    assert result["ttft_ms"]["p50"] <= result["e2e_latency_ms"]["p50"]
    assert result["output_tokens_per_s"] > 0 and result["request_throughput"] > 0
    assert result["config"]["max_concurrency"] == 6
    # The command as given to kvdeck (not pytest's), the key's value left out.
    assert result["command"].startswith(f"kvdeck bench serve --base-url {server.base_url} ")
    assert result["command"].endswith(" --api-key REDACTED")
    assert "sk-not-for-the-json" not in out.read_text()
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_unreachable_server_is_a_clear_error(capsys):
    code = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert code == 2
    assert "cannot reach a server at http://127.0.0.1:9" in capsys.readouterr().err
