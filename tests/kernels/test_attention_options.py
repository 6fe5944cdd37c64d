"""Sliding windows, soft-capped scores and 8-bit KV caches: the torch path and the Triton
kernel (interpreted) against a dense per-token loop over the dequantised cache; the
quantising cache writes bit for bit against the torch reference."""

import pytest
import torch

from kvdeck.kernels.reference.attention import paged_attention_torch
from kvdeck.kernels.reference.kv_cache import write_kv_cache_torch
from kvdeck.kernels.reference.kv_quant import (
    FP8_DTYPES,
    FP8_MAX,
    dequantize,
    kv_cache_format,
    quantize_fp8,
    quantize_int8_rows,
)
from kvdeck.kernels.triton.attention import paged_attention_triton, paged_attention_triton_impl
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton

# Decode rows, a fresh prefill longer than the window, and extends whose chunk starts
# before, at and after the window's reach.
MIXED = ([1, 1, 40, 9, 1, 20], [3, 70, 40, 50, 130, 90])


def dense_reference(batch, k_cache, v_cache, window: int = 0, soft_cap: float = 0.0) -> torch.Tensor:
    """Per query token: the keys it sees (causal, within `window`), scores (capped), softmax."""
    q = batch.q.float()
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    starts = batch.query_start_loc.tolist()
    out = torch.empty_like(q)
    for seq, seq_len in enumerate(batch.seq_lens.tolist()):
        table = batch.block_tables[seq].tolist()
        keys = torch.stack([k_cache[table[p // block_size], p % block_size] for p in range(seq_len)])
        values = torch.stack([v_cache[table[p // block_size], p % block_size] for p in range(seq_len)])
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        for token in range(starts[seq], starts[seq + 1]):
            position = seq_len - (starts[seq + 1] - starts[seq]) + (token - starts[seq])
            first = max(0, position - window + 1) if window else 0
            scores = torch.einsum("hd,lhd->hl", q[token], keys[first : position + 1]) * batch.scale
            if soft_cap:
                scores = torch.tanh(scores / soft_cap) * soft_cap
            out[token] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values[first : position + 1])
    return out


def quantized_caches(batch, kv_cache_dtype: str):
    """(stored k, stored v, k_scale, v_scale, dequantised k, dequantised v) of the batch's cache."""
    fmt = kv_cache_format(kv_cache_dtype, torch.float32)
    if fmt.storage in FP8_DTYPES:
        k_scale, v_scale = 0.5, 2.0  # not 1, so a scale folded in the wrong place shows
        k, v = (quantize_fp8(c, fmt.storage, s) for c, s in ((batch.k_cache, k_scale),
                                                             (batch.v_cache, v_scale)))
    elif fmt.storage == torch.int8:
        (k, k_scale), (v, v_scale) = quantize_int8_rows(batch.k_cache), quantize_int8_rows(batch.v_cache)
    else:
        k, v, k_scale, v_scale = batch.k_cache.to(fmt.storage), batch.v_cache.to(fmt.storage), None, None
    restored = dequantize(k, k_scale, torch.float32), dequantize(v, v_scale, torch.float32)
    return k, v, k_scale, v_scale, *restored


@pytest.mark.parametrize("window", [0, 1, 16, 25, 64])
@pytest.mark.parametrize("soft_cap", [0.0, 3.0])
def test_torch_path_window_and_soft_cap(paged_batch, window, soft_cap):
    batch = paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                        dtype=torch.float32, seed=window)
    got = paged_attention_torch(*batch.args(), sliding_window=window, soft_cap=soft_cap)
    expected = dense_reference(batch, batch.k_cache, batch.v_cache, window, soft_cap)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("window, soft_cap, tile_n", [(25, 0.0, 128), (16, 3.0, 128), (40, 0.0, 16)])
def test_triton_window_and_soft_cap(paged_batch, window, soft_cap, tile_n):
    from kvdeck.kernels.triton.attention_tuning import AttentionConfig

    batch = paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                        dtype=torch.float32, seed=7)
    # Small KV tiles put the window's edge, unmasked tiles and the diagonal in one row.
    config = AttentionConfig(block_m=16, tile_n=tile_n, num_warps=4, num_stages=1)
    got = paged_attention_triton_impl(*batch.args(), sliding_window=window, soft_cap=soft_cap,
                                      config=config)
    expected = dense_reference(batch, batch.k_cache, batch.v_cache, window, soft_cap)
    torch.testing.assert_close(got, expected, atol=3e-5, rtol=3e-5)


def test_triton_window_with_split_decode(paged_batch):
    batch = paged_batch([1, 1], [300, 70], num_heads=4, num_kv_heads=1, head_dim=32, block_size=16,
                        dtype=torch.float32, seed=8)
    got = paged_attention_triton_impl(*batch.args(), sliding_window=100, num_segments=4)
    torch.testing.assert_close(got, dense_reference(batch, batch.k_cache, batch.v_cache, 100),
                               atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2", "int8", "bfloat16"])
def test_quantized_caches_read_dequantised(paged_batch, kv_cache_dtype):
    """Both paths read an 8-bit (or 16-bit) cache as its dequantised values: compared with the
    dense loop over those values, only fp32 rounding is left."""
    batch = paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                        dtype=torch.float32, seed=9)
    k, v, k_scale, v_scale, k_deq, v_deq = quantized_caches(batch, kv_cache_dtype)
    expected = dense_reference(batch, k_deq, v_deq, window=25)
    args = (batch.q, k, v, *batch.args()[3:])
    for attend in (paged_attention_torch, paged_attention_triton):
        got = attend(*args, sliding_window=25, k_scale=k_scale, v_scale=v_scale)
        torch.testing.assert_close(got, expected, atol=3e-5, rtol=3e-5, msg=attend.__name__)


def test_8bit_is_close_to_the_float_cache(paged_batch):
    """What quantisation costs on attention outputs (random unit-variance K/V): relative
    error about 0.7% for int8 (7 bits per row's range), 3% for e4m3 (3 mantissa bits), 6.5%
    for e5m2 (2 bits), measured over seeds; the bounds leave room above those."""
    batch = paged_batch(*MIXED, num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                        dtype=torch.float32, seed=10)
    exact = paged_attention_torch(*batch.args())
    errors = {}
    for kv_cache_dtype, bound in (("int8", 0.012), ("fp8_e4m3", 0.05), ("fp8_e5m2", 0.1)):
        k, v, k_scale, v_scale, _, _ = quantized_caches(batch, kv_cache_dtype)
        got = paged_attention_torch(batch.q, k, v, *batch.args()[3:], k_scale=k_scale, v_scale=v_scale)
        errors[kv_cache_dtype] = float((got - exact).norm() / exact.norm())
        assert errors[kv_cache_dtype] < bound, (kv_cache_dtype, errors[kv_cache_dtype])
    assert errors["int8"] < errors["fp8_e4m3"] < errors["fp8_e5m2"]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_write_rounds_as_torch_at_every_code(dtype):
    """Every finite code, the midpoints between neighbours (ties to even), values just either
    side of them, subnormals, zeros and out-of-range values (saturated)."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = codes[torch.isfinite(codes)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([grid, mids, mids.nextafter(torch.full_like(mids, 1e9)),
                        mids.nextafter(torch.full_like(mids, -1e9)),
                        torch.tensor([1e-30, -1e-30, 0.0, -0.0, 1e6, -1e6])])
    key = values[:, None, None].expand(-1, 1, 16).contiguous()
    slots = torch.arange(values.numel())
    caches = []
    for write in (write_kv_cache_torch, write_kv_cache_triton):
        k = torch.zeros(values.numel(), 1, 1, 16, dtype=dtype)
        v = torch.zeros_like(k)
        write(key, key, k, v, slots, 1.0, 1.0)
        caches.append(k.view(torch.uint8))
    assert torch.equal(caches[0], caches[1])


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_quantizing_writes_match_the_reference(kv_cache_dtype):
    gen = torch.Generator().manual_seed(1)
    num_tokens, heads, head_dim, blocks, block_size = 37, 2, 24, 8, 16
    spread = torch.tensor([1e-4, 1.0, 3.0, 500.0, 0.01, 1e3]).repeat(4)  # per-dim magnitudes
    key = torch.randn(num_tokens, heads, head_dim, generator=gen) * spread
    value = torch.randn(num_tokens, heads, head_dim, generator=gen)
    key[5] = 0.0  # an all-zero row: scale 0, values 0
    slots = torch.randperm(blocks * block_size, generator=gen)[:num_tokens]
    slots[3] = -1  # padding: skipped
    storage = kv_cache_format(kv_cache_dtype, torch.float32).storage
    results = []
    for write in (write_kv_cache_torch, write_kv_cache_triton):
        k = torch.zeros(blocks, block_size, heads, head_dim, dtype=storage)
        v = torch.zeros_like(k)
        if storage == torch.int8:
            k_scale = torch.zeros(blocks, block_size, heads, dtype=torch.float16)
            v_scale = torch.zeros_like(k_scale)
        else:
            k_scale, v_scale = 0.5, 2.0
        write(key, value, k, v, slots, k_scale, v_scale)
        results.append((k.view(torch.uint8), v.view(torch.uint8), k_scale, v_scale))
    for got, expected in zip(results[1], results[0]):
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(expected))
    # The written rows dequantise close to the input (fp8: within half a step of its
    # mantissa, or its subnormal step, or saturated at the format's largest value).
    k, _, k_scale, _ = results[0]
    written = slots >= 0
    stored = k.view(storage).view(-1, heads, head_dim)[slots[written]]
    scale = k_scale.view(-1, heads)[slots[written]] if storage == torch.int8 else k_scale
    restored, original = dequantize(stored, scale, torch.float32), key[written]
    if storage == torch.int8:
        bound = original.abs().amax(-1, keepdim=True) / 127 * 0.51
        assert ((restored - original).abs() <= bound + 1e-6).all()
        return
    limit = FP8_MAX[storage] * k_scale
    mantissa, smallest = {"fp8_e4m3": (3, 2**-9), "fp8_e5m2": (2, 2**-16)}[kv_cache_dtype]
    in_range = original.abs() <= limit
    error = (restored - original).abs()
    assert (error[in_range] <= original.abs()[in_range] * 2**-(mantissa + 1) + smallest * k_scale).all()
    assert torch.equal(restored[~in_range], original[~in_range].sign() * limit)
