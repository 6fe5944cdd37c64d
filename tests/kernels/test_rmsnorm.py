"""Triton RMSNorm (with and without the fused residual add) vs the torch reference."""

import pytest
import torch

from kvdeck.kernels.reference.rmsnorm import rms_norm_torch
from kvdeck.kernels.triton.rmsnorm import rms_norm_triton

# Both sides round the same fp32 math to the output dtype; bf16 gets a few ulp because the
# interpreter casts fp32 -> bf16 by truncation, not round-to-nearest-even as GPUs do.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_reference(tile_budget, dtype, shape, with_residual):
    gen = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype) if with_residual else None
    x_before = x.clone()
    expected = rms_norm_torch(x, weight, 1e-6, residual)
    got = rms_norm_triton(x, weight, 1e-6, residual)
    assert torch.equal(x, x_before)  # inputs are not modified
    tol = TOLERANCE[dtype]
    if with_residual:
        if dtype == torch.bfloat16:
            torch.testing.assert_close(got[1], expected[1], atol=tol, rtol=tol)
        else:  # the sum is rounded exactly like x + r
            assert torch.equal(got[1], expected[1])
        torch.testing.assert_close(got[0], expected[0], atol=tol, rtol=tol)
    else:
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_non_contiguous_rows_and_fp32_weight(tile_budget):
    # Per-head q norm (Qwen3) on a view of a fused qkv buffer, with an fp32 weight.
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(4, 3 * 8 * 16, generator=gen).half()
    q = qkv[:, : 8 * 16].view(4, 8, 16)
    weight = torch.rand(16, generator=gen) + 0.5
    expected = rms_norm_torch(q, weight, 1e-5)
    got = rms_norm_triton(q, weight, 1e-5)
    assert got.dtype == expected.dtype == torch.float32
    # Both round the normalised value to fp16 before the fp32 weight; their sums of squares
    # may differ in the last fp32 bit (reduction order), which can move that rounding by one
    # fp16 ulp (5e-4 relative): fp16's tolerance, as in test_matches_reference.
    tol = TOLERANCE[torch.float16]
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_rejects_wrong_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(torch.randn(2, 8), torch.ones(7), 1e-6)
