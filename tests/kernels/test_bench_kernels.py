"""benchmarks/bench_kernels.py parses its arguments and refuses to time anything off-GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"


def run_script(*args: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_help():
    shown = run_script("--help", interpret=False)
    assert shown.returncode == 0 and "--sweep" in shown.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_cuda_or_under_interpreter():
    no_gpu = run_script("--quick", interpret=False)
    assert no_gpu.returncode == 2 and "needs a CUDA GPU" in no_gpu.stderr
    interpreted = run_script("--quick", interpret=True)
    assert interpreted.returncode == 2 and "TRITON_INTERPRET" in interpreted.stderr
