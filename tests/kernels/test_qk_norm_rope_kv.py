"""The fused q/k RMSNorm + RoPE + KV-cache write (one Triton launch) equals the unfused
sequence: the reference composition, and the Triton kernels it replaces."""

import pytest
import torch

from kvdeck.kernels.compile_counter import kernel_compiles
from kvdeck.kernels.reference.qk_norm_rope_kv import qk_norm_rope_kv_write_torch
from kvdeck.kernels.reference.rope import build_cos_sin_cache
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton
from kvdeck.kernels.triton.qk_norm_rope_kv import qk_norm_rope_kv_write_triton
from kvdeck.kernels.triton.rmsnorm import rms_norm_triton
from kvdeck.kernels.triton.rope import apply_rope_triton

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3}
BLOCK_SIZE = 4


def make_case(num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim, dtype, norm, seed=0):
    gen = torch.Generator().manual_seed(seed + num_tokens + head_dim)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = (torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen) * 2).to(dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    cache = build_cos_sin_cache(inv_freq, 64)
    positions = torch.randint(0, 64, (num_tokens,), generator=gen)
    num_blocks = num_tokens // BLOCK_SIZE + 3
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:num_tokens]
    slots[::3] = -1  # padding rows: not written
    weights = [(torch.rand(head_dim, generator=gen) + 0.5).to(dtype) for _ in range(2)] \
        if norm else [None, None]
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=gen).to(dtype)
    return qkv, cache, positions, slots, weights, k_cache, k_cache.clone() * 0.5


def split(qkv, num_heads, num_kv_heads, head_dim):
    """Strided views of the fused buffer, as the model passes them (no copies)."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return (q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim),
            v.view(-1, num_kv_heads, head_dim))


def run_fused(fn, case, heads, is_neox, positions_dtype=torch.int64):
    qkv, cache, positions, slots, (qw, kw), k_cache, v_cache = case
    qkv, k_cache, v_cache = qkv.clone(), k_cache.clone(), v_cache.clone()
    q, k, v = split(qkv, *heads)
    q, k = fn(positions.to(positions_dtype), q, k, v, cache, is_neox, k_cache, v_cache, slots,
              qw, kw, 1e-6)
    return q, k, k_cache, v_cache, qkv


def run_unfused_triton(case, heads, is_neox):
    qkv, cache, positions, slots, (qw, kw), k_cache, v_cache = case
    qkv, k_cache, v_cache = qkv.clone(), k_cache.clone(), v_cache.clone()
    q, k, v = split(qkv, *heads)
    if qw is not None:
        q, k = rms_norm_triton(q, qw, 1e-6), rms_norm_triton(k, kw, 1e-6)
    q, k = apply_rope_triton(positions, q, k, cache, is_neox)
    write_kv_cache_triton(k, v, k_cache, v_cache, slots)
    return q, k, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 3, 17])
@pytest.mark.parametrize("heads, head_dim, rotary_dim, is_neox", [
    ((4, 2), 64, 64, True),    # GQA 2
    ((8, 2), 128, 128, True),  # GQA 4 (Qwen3's head_dim)
    ((2, 2), 64, 64, False),   # interleaved pairs, MHA
    ((4, 1), 64, 32, True),    # partial rotary, MQA
    ((3, 1), 80, 48, False),   # padded head_dim, partial interleaved
])
def test_fused_equals_the_unfused_sequence(tile_budget, dtype, norm, num_tokens, heads, head_dim,
                                          rotary_dim, is_neox):
    case = make_case(num_tokens, *heads, head_dim, rotary_dim, dtype, norm)
    q, k, k_cache, v_cache, qkv = run_fused(qk_norm_rope_kv_write_triton, case,
                                            (*heads, head_dim), is_neox)
    ref = run_fused(qk_norm_rope_kv_write_torch, case, (*heads, head_dim), is_neox)
    tol = TOLERANCE[dtype]
    for got, want in zip((q, k, k_cache, v_cache), ref[:4]):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # The Triton kernels it replaces round the same way: equal, not merely close.
    for got, want in zip((q, k, k_cache, v_cache),
                         run_unfused_triton(case, (*heads, head_dim), is_neox)):
        assert torch.equal(got, want)
    # In place on the fused buffer; v is read through its strided view and left alone.
    assert q.data_ptr() == qkv.data_ptr()
    kv_size = heads[1] * head_dim
    assert torch.equal(qkv[:, -kv_size:], case[0][:, -kv_size:])
    # Slot -1 rows wrote nothing: the untouched slots keep the cache's old contents.
    written = torch.zeros(k_cache.shape[0] * BLOCK_SIZE, dtype=torch.bool)
    written[case[3][case[3] >= 0]] = True
    assert torch.equal(k_cache.view(-1, *k_cache.shape[2:])[~written],
                       case[5].view(-1, *k_cache.shape[2:])[~written])


def test_token_counts_do_not_recompile():
    heads = (4, 2, 64)
    for num_tokens in (1, 3, 16, 17, 32):
        case = make_case(num_tokens, 4, 2, 64, 64, torch.float16, True)
        run_fused(qk_norm_rope_kv_write_triton, case, heads, True)
        if num_tokens == 1:
            after_first = kernel_compiles()
    assert kernel_compiles() == after_first


def test_8bit_cache_and_mismatched_weights_take_the_unfused_kernels():
    case = make_case(5, 4, 2, 64, 64, torch.float16, True)
    qkv, cache, positions, slots, (qw, kw), k_cache, v_cache = case
    q, k, v = split(qkv.clone(), 4, 2, 64)
    k8 = torch.zeros(k_cache.shape, dtype=torch.int8)
    v8 = torch.zeros_like(k8)
    k_scale = torch.zeros(k_cache.shape[:3], dtype=torch.float16)
    v_scale = torch.zeros_like(k_scale)
    qkv_ref = qkv.clone()
    q_ref, k_ref, v_ref = split(qkv_ref, 4, 2, 64)
    k8_ref, v8_ref = k8.clone(), v8.clone()
    ks_ref, vs_ref = k_scale.clone(), v_scale.clone()
    got = qk_norm_rope_kv_write_triton(positions, q, k, v, cache, True, k8, v8, slots,
                                       qw.float(), kw.float(), 1e-6, k_scale, v_scale)
    want = qk_norm_rope_kv_write_torch(positions, q_ref, k_ref, v_ref, cache, True, k8_ref,
                                       v8_ref, slots, qw.float(), kw.float(), 1e-6, ks_ref, vs_ref)
    torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=1e-3)
    assert (k8 != 0).any()
    torch.testing.assert_close(k8.float(), k8_ref.float(), atol=1, rtol=0)
    torch.testing.assert_close(k_scale, ks_ref, atol=1e-3, rtol=1e-3)


def test_rejects_a_lone_norm_weight():
    case = make_case(2, 2, 1, 64, 64, torch.float32, True)
    with pytest.raises(ValueError, match="q_weight and k_weight"):
        qkv, cache, positions, slots, (qw, _), k_cache, v_cache = case
        q, k, v = split(qkv, 2, 1, 64)
        qk_norm_rope_kv_write_triton(positions, q, k, v, cache, True, k_cache, v_cache, slots,
                                     qw, None)
