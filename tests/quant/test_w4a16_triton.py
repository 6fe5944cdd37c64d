"""The Triton W4A16 GEMM against the dequantise-then-matmul reference (TRITON_INTERPRET=1 on
CPU, set by tests/conftest.py before triton loads)."""

import os

import pytest
import torch

from kvdeck.kernels.w4a16_gemm import w4a16_gemm, w4a16_gemm_torch, w4a16_gemm_triton
from tests.quant.awq_reference import reference_dequantize

needs_triton_here = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1",
)


def _random_awq(k: int, n: int, group: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), generator=gen, dtype=torch.int32)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (k // group, n // 8), generator=gen,
                           dtype=torch.int32)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(dtype)
    return qweight, qzeros, scales


def test_torch_reference_matches_independent_dequantiser():
    qweight, qzeros, scales = _random_awq(256, 64, 128, torch.float32, 0)
    x = torch.randn(3, 256, dtype=torch.float64)
    expected = x @ reference_dequantize(qweight, qzeros, scales, 128)
    out = w4a16_gemm_torch(x.float(), qweight, qzeros, scales, 128)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


@needs_triton_here
@pytest.mark.parametrize(
    ("m", "k", "n", "group", "dtype", "split_k"),
    [
        (1, 128, 64, 128, torch.float32, None),
        (3, 256, 96, 64, torch.float32, 2),  # N not a multiple of the tile
        (17, 256, 128, 32, torch.float16, 3),  # M past one tile, uneven split-K
        (5, 512, 64, 128, torch.float16, 4),
        (33, 128, 32, 128, torch.float32, 1),
    ],
)
def test_triton_kernel_matches_reference(m, k, n, group, dtype, split_k):
    qweight, qzeros, scales = _random_awq(k, n, group, dtype, seed=m + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    bias = torch.randn(n).to(dtype)
    out = w4a16_gemm_triton(x, qweight, qzeros, scales, group, bias, split_k=split_k)
    expected = x.double() @ reference_dequantize(qweight, qzeros, scales, group) + bias.double()
    assert out.dtype == dtype and out.shape == (m, n)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * 10)


@needs_triton_here
def test_triton_kernel_reads_strided_input():
    qweight, qzeros, scales = _random_awq(128, 64, 64, torch.float32, 5)
    wide = torch.randn(4, 256)
    x = wide[:, ::2]  # non-contiguous rows
    out = w4a16_gemm_triton(x, qweight, qzeros, scales, 64)
    torch.testing.assert_close(out, w4a16_gemm_torch(x, qweight, qzeros, scales, 64),
                               rtol=1e-4, atol=1e-4)


def test_dispatch_uses_reference_on_cpu_and_rejects_unknown_backend():
    qweight, qzeros, scales = _random_awq(128, 32, 128, torch.float32, 6)
    x = torch.randn(2, 128)
    torch.testing.assert_close(w4a16_gemm(x, qweight, qzeros, scales, 128),
                               w4a16_gemm_torch(x, qweight, qzeros, scales, 128))
    with pytest.raises(ValueError, match="backend"):
        w4a16_gemm(x, qweight, qzeros, scales, 128, backend="cuda")


def test_triton_wrapper_rejects_mismatched_shapes():
    qweight, qzeros, scales = _random_awq(128, 32, 128, torch.float32, 7)
    with pytest.raises(ValueError, match="do not match"):
        w4a16_gemm_triton(torch.randn(2, 256), qweight, qzeros, scales, 128)
