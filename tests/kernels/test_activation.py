"""Triton SiLU-and-mul and GELU(tanh)-and-mul vs the torch references."""

import pytest
import torch

from kvdeck.kernels.reference.activation import gelu_tanh_and_mul_torch, silu_and_mul_torch
from kvdeck.kernels.triton.activation import gelu_tanh_and_mul_triton, silu_and_mul_triton

PAIRS = {"silu": (silu_and_mul_torch, silu_and_mul_triton),
         "gelu_tanh": (gelu_tanh_and_mul_torch, gelu_tanh_and_mul_triton)}

# bf16: the interpreter casts fp32 -> bf16 by truncation, so allow a few ulp.
TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("act", PAIRS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 2 * 48), (2, 2, 2 * 20), (2, 2 * 1100)])
def test_matches_reference(tile_budget, act, dtype, shape):
    # 1100 spans two column blocks of the kernel; 48 and 20 are not powers of two.
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 4).to(dtype)
    reference, kernel = PAIRS[act]
    expected = reference(x)
    got = kernel(x)
    assert got.shape == expected.shape and got.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("act", PAIRS)
def test_non_contiguous_input(tile_budget, act):
    x = torch.randn(8, 2 * 32)[::2]
    reference, kernel = PAIRS[act]
    torch.testing.assert_close(kernel(x), reference(x))


def test_gelu_tanh_is_not_silu(tile_budget):
    x = torch.randn(4, 2 * 16)
    assert not torch.allclose(gelu_tanh_and_mul_triton(x), silu_and_mul_triton(x), atol=1e-3)


def test_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_triton(torch.randn(2, 7))
