"""The GPU's int8 output head (kernels/triton/int8_head.py) under the interpreter against its
torch reference: decode's few rows and larger steps, a vocabulary and a hidden size that are
not whole tiles, strided rows, and its errors."""

import pytest
import torch

from kvdeck.kernels import dispatch
from kvdeck.kernels.reference.int8_gemm import dequantize_int8_blocks, int8_head_torch, quantize_int8_blocks
from kvdeck.kernels.triton.int8_head import head_config, int8_head_triton


def _head(v: int, h: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    weight = torch.randn(v, h, generator=torch.Generator().manual_seed(seed)) * 0.05
    q, scales = quantize_int8_blocks(weight)
    return weight, q, scales


@pytest.mark.parametrize("m", [1, 3, 16, 17, 70])
@pytest.mark.parametrize(("v", "h"), [(200, 96), (128, 256), (333, 160)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_kernel_gives_the_reference(m, v, h, dtype):
    _, q, scales = _head(v, h)
    x = torch.randn(m, h).to(dtype)
    got = int8_head_triton(x, q, scales)
    want = int8_head_torch(x, q, scales)
    assert got.dtype == dtype and got.shape == (m, v)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)


def test_leading_dims_strided_rows_and_no_rows():
    _, q, scales = _head(130, 64)
    wide = torch.randn(2, 3, 100)
    x = wide[..., 10:74]  # rows 100 apart, unit stride along the hidden size
    torch.testing.assert_close(int8_head_triton(x, q, scales), int8_head_torch(x.contiguous(), q, scales))
    assert int8_head_triton(torch.empty(0, 64), q, scales).shape == (0, 130)


def test_the_reference_is_the_dequantised_weights_product():
    weight, q, scales = _head(64, 64)
    x = torch.randn(4, 64)
    torch.testing.assert_close(int8_head_torch(x, q, scales), x @ dequantize_int8_blocks(q, scales).t())
    # Q8_0: each weight within half a step (its block's amax / 127) of the dense one.
    step = weight.abs().view(64, 2, 32).amax(-1, keepdim=True) / 127
    assert ((dequantize_int8_blocks(q, scales) - weight).view(64, 2, 32).abs() <= step * 0.5 + 1e-4).all()


def test_dispatch_picks_the_backend():
    _, q, scales = _head(64, 64)
    x = torch.randn(2, 64)
    torch.testing.assert_close(dispatch.int8_head(x, q, scales, "triton"), int8_head_torch(x, q, scales))
    assert torch.equal(dispatch.int8_head(x, q, scales), int8_head_torch(x, q, scales))  # auto on CPU
    with pytest.raises(ValueError, match="int8 head backend must be one of"):
        dispatch.int8_head(x, q, scales, "cuda")


def test_a_mismatched_head_is_a_clear_error():
    _, q, scales = _head(64, 64)
    with pytest.raises(ValueError, match=r"x \[..., 32\] does not match q \(64, 64\)"):
        int8_head_triton(torch.randn(2, 32), q, scales)
    with pytest.raises(ValueError, match="q must be int8"):
        int8_head_triton(torch.randn(2, 64), q.to(torch.int16), scales)


def test_configs_by_rows():
    assert head_config(1) == head_config(16) == (16, 128, 4, 6)
    assert head_config(17) == head_config(4096) == (64, 128, 8, 4)
