"""benchmarks/profile_decode.py on CPU with a tiny model: step times, operator and function
tables per batch size, and the JSON a GPU lease brings back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_decode.py"

pytestmark = pytest.mark.timeout(300)


def test_profile_names_operators_and_functions_per_batch(tiny_llama_dir, tmp_path):
    out = tmp_path / "profile.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(tiny_llama_dir), "--load-format", "auto",
         "--dtype", "float32", "--batch-sizes", "1,3", "--input-len", "4", "--output-len", "6",
         "--top", "5", "--kv-cache-memory-gib", "0.01", "--out", str(out)],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["benchmark"] == "profile_decode"
    assert set(figures["batches"]) == {"1", "3"}
    for batch in figures["batches"].values():
        assert batch["ms_per_step"] > 0
        host = batch["torch_operators"]["by_host"]
        assert 0 < len(host) <= 5 and host[0]["self_host_ms_per_step"] > 0
        assert any(row["name"].startswith("aten::") for row in host)
        functions = batch["python_functions"]
        assert len(functions) == 5
        assert functions[0]["self_ms_per_step"] >= functions[-1]["self_ms_per_step"]
        assert batch["kernels"]["steps"] == 6  # the device's share (none recorded on the CPU)
    assert "top by python time" in result.stdout


def test_profile_refuses_a_single_token_output(tiny_llama_dir):
    result = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tiny_llama_dir),
                             "--output-len", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--output-len must be at least 2" in result.stderr
