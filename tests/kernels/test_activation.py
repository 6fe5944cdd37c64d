"""Triton SiLU-and-mul vs the torch reference."""

import pytest
import torch

from kvdeck.kernels.activation import silu_and_mul_torch
from kvdeck.kernels.activation_triton import silu_and_mul_triton

# bf16: the interpreter casts fp32 -> bf16 by truncation, so allow a few ulp.
TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 2 * 48), (2, 2, 2 * 20), (2, 2 * 1100)])
def test_matches_reference(tile_budget, dtype, shape):
    # 1100 spans two column blocks of the kernel; 48 and 20 are not powers of two.
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 4).to(dtype)
    expected = silu_and_mul_torch(x)
    got = silu_and_mul_triton(x)
    assert got.shape == expected.shape and got.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_non_contiguous_input(tile_budget):
    x = torch.randn(8, 2 * 32)[::2]
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_torch(x))


def test_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_triton(torch.randn(2, 7))
