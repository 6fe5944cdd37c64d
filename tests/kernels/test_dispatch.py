"""`select_ops` picks Triton under the interpreter and refuses it on CPU without one."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvdeck.kernels.dispatch import TORCH_OPS, select_ops

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_triton_on_cpu_under_interpreter():
    ops = select_ops("triton", torch.device("cpu"))
    assert ops.name == "triton"
    x = torch.randn(3, 2 * 16)
    torch.testing.assert_close(ops.silu_and_mul(x), TORCH_OPS.silu_and_mul(x))


def test_auto_and_torch_on_cpu_are_torch():
    assert select_ops("auto", torch.device("cpu")) is TORCH_OPS
    assert select_ops("torch", torch.device("cpu")) is TORCH_OPS


def test_unknown_backend():
    with pytest.raises(ValueError, match="attention_backend"):
        select_ops("flashinfer", torch.device("cpu"))


def test_triton_on_cpu_without_interpreter_is_refused():
    # A fresh process: this one already has TRITON_INTERPRET=1 baked into its kernels.
    code = (
        "import torch\n"
        "from kvdeck.kernels.dispatch import select_ops\n"
        "try:\n"
        "    select_ops('triton', torch.device('cpu'))\n"
        "except ValueError as e:\n"
        "    print('REFUSED:', e)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "REFUSED:" in result.stdout and "TRITON_INTERPRET=1" in result.stdout
