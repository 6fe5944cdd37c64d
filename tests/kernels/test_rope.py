"""Triton RoPE (neox and interleaved, full and partial rotary) vs the torch reference."""

import pytest
import torch

from kvdeck.kernels.reference.rope import apply_rope_torch, build_cos_sin_cache
from kvdeck.kernels.triton.rope import apply_rope_triton

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


def cos_sin_cache(rotary_dim: int, max_positions: int = 64) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    return build_cos_sin_cache(inv_freq, max_positions)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 64), (80, 80), (64, 32)])
def test_matches_reference_in_place_on_qkv_views(tile_budget, is_neox, dtype, head_dim, rotary_dim):
    gen = torch.Generator().manual_seed(head_dim + rotary_dim)
    num_tokens, num_heads, num_kv_heads = 5, 6, 2
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    qkv = qkv.to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim:].clone()
    positions = torch.tensor([0, 3, 17, 63, 4], dtype=torch.int64)
    cache = cos_sin_cache(rotary_dim)
    expected_q, expected_k = apply_rope_torch(positions, q.clone(), k.clone(), cache, is_neox)
    got_q, got_k = apply_rope_triton(positions.int(), q, k, cache, is_neox)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q, expected_q, atol=tol, rtol=tol)
    torch.testing.assert_close(got_k, expected_k, atol=tol, rtol=tol)
    # In place on the fused buffer; the value part is left alone.
    assert got_q.data_ptr() == q.data_ptr()
    torch.testing.assert_close(qkv[:, : num_heads * head_dim].view_as(q), expected_q,
                               atol=tol, rtol=tol)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim:], v_before)


def test_rejects_rotary_dim_wider_than_head():
    q = torch.randn(2, 2, 16)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rope_triton(torch.zeros(2, dtype=torch.int64), q, q.clone(), cos_sin_cache(32))
