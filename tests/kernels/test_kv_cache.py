"""Triton KV-cache write vs the torch reference."""

import pytest
import torch

from kvdeck.kernels.reference.kv_cache import write_kv_cache_torch
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size, num_kv_heads, head_dim", [(16, 2, 64), (32, 3, 80)])
def test_write_matches_reference(tile_budget, dtype, block_size, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks, num_tokens = 6, 9
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    # key/value as the engine has them: head views into one fused qkv projection.
    qkv = torch.randn(num_tokens, (4 + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    key = qkv[:, 4 * head_dim:(4 + num_kv_heads) * head_dim].view(-1, num_kv_heads, head_dim)
    value = qkv[:, (4 + num_kv_heads) * head_dim:].view(-1, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # padding tokens
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_kv_cache_torch(key, value, expected_k, expected_v, slots)
    write_kv_cache_triton(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_rejects_bad_slot_mapping():
    key = torch.zeros(3, 2, 64)
    cache = torch.zeros(2, 16, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache_triton(key, key, cache, cache.clone(), torch.zeros(2, dtype=torch.int64))
