"""The GPU battery's entry points run with only what the lent GPU image has (torch, triton,
transformers, safetensors, numpy): every other dependency of kvdeck is blocked on import."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("gpu_image_imports.py")

pytestmark = pytest.mark.timeout(300)


def kvdeck_on_gpu_image(*args: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, str(RUNNER), *args], cwd=cwd, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_help_lists_every_command_without_importing_them(tmp_path):
    out = kvdeck_on_gpu_image("--help", cwd=tmp_path)
    for command in ("pull", "models", "quantize", "eval-ppl", "bench"):
        assert command in out


def test_bench_decode_and_throughput_run(tiny_llama_dir, tmp_path):
    decode = tmp_path / "decode.json"
    kvdeck_on_gpu_image("bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "8",
                        "--output-len", "4", "--repeats", "1", "--kv-cache-memory-gib", "0.01",
                        "--out", str(decode), cwd=tmp_path)
    assert json.loads(decode.read_text())["decode"]["time_per_output_token_s"] > 0
    throughput = tmp_path / "throughput.json"
    kvdeck_on_gpu_image("bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "4",
                        "--input-len", "8:16", "--output-len", "4:8", "--kv-cache-memory-gib", "0.01",
                        "--out", str(throughput), "--plot", str(tmp_path / "t.png"), cwd=tmp_path)
    assert json.loads(throughput.read_text())["kvdeck"]["output_tokens_per_s"] > 0
    assert not (tmp_path / "t.png").exists()  # no matplotlib there: no plot, and no failure


def test_the_blocker_blocks(tmp_path):
    result = subprocess.run([sys.executable, str(RUNNER), "models"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "is not on the GPU image" in result.stderr


def test_run_gpu_script_runs_the_staged_package_from_the_checkout(tmp_path):
    # The first H100 run failed every stage: run from the checkout's root, the root's kvdeck/
    # folder (the namespace's __init__ alone) shadowed the staged package.
    repo = RUNNER.parents[2]
    python = f"{sys.executable} {RUNNER.with_name('python_on_gpu_image.py')}"
    result = subprocess.run(["bash", str(repo / "benchmarks" / "run_gpu.sh"), "imports", str(tmp_path)],
                            cwd=repo, env={**os.environ, "PYTHON": python}, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "the staged package runs" in result.stdout
