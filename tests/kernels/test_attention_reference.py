"""The torch paged attention (the CPU path and the Triton kernel's reference) against a
plain per-sequence loop: dense K/V rebuilt token by token, causal softmax, GQA by repeat."""

import pytest
import torch

from kvdeck.kernels.reference.attention import gather_dot, paged_attention_torch


def dense_reference(batch) -> torch.Tensor:
    q, k_cache, v_cache = (t.float() for t in (batch.q, batch.k_cache, batch.v_cache))
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
            scores = torch.einsum("hd,lhd->hl", q[token], keys[: position + 1]) * batch.scale
            out[token] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values[: position + 1])
    return out


CASES = {
    "decode_ragged": ([1] * 9, [1, 5, 16, 17, 40, 41, 90, 130, 200]),
    "prefill_only": ([7, 33, 16], [7, 33, 16]),
    "extend_and_decode": ([1, 12, 1, 30, 3], [64, 12, 17, 70, 40]),
    "one_token_extend": ([1, 1, 5], [3, 50, 5]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gqa", [1, 2, 4])
def test_matches_dense_loop(paged_batch, case, gqa):
    query_lens, seq_lens = CASES[case]
    batch = paged_batch(query_lens, seq_lens, num_heads=2 * gqa, num_kv_heads=2, head_dim=32,
                        block_size=16, dtype=torch.float32, seed=len(case) + gqa)
    torch.testing.assert_close(paged_attention_torch(*batch.args()), dense_reference(batch),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_caches(paged_batch, dtype):
    batch = paged_batch(*CASES["extend_and_decode"], num_heads=4, num_kv_heads=2, head_dim=64,
                        block_size=16, dtype=dtype)
    out = paged_attention_torch(*batch.args())
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), dense_reference(batch), atol=2e-2, rtol=2e-2)


def test_shared_prefix_blocks(paged_batch):
    batch = paged_batch([1, 1, 20], [70, 45, 52], num_heads=4, num_kv_heads=1, head_dim=32,
                        block_size=16, dtype=torch.float32, shared_prefix_blocks=2)
    torch.testing.assert_close(paged_attention_torch(*batch.args()), dense_reference(batch),
                               atol=2e-5, rtol=2e-5)


def test_plan_is_rebuilt_for_a_new_step(paged_batch):
    # The same metadata objects reuse the plan; new ones (the next step) must not.
    first = paged_batch([1, 1], [10, 30], num_heads=2, num_kv_heads=2, head_dim=32, block_size=16,
                        dtype=torch.float32, seed=1)
    second = paged_batch([1, 1], [31, 4], num_heads=2, num_kv_heads=2, head_dim=32, block_size=16,
                         dtype=torch.float32, seed=2)
    for batch in (first, second, first):
        torch.testing.assert_close(paged_attention_torch(*batch.args()), dense_reference(batch),
                                   atol=2e-5, rtol=2e-5)


def test_stale_non_finite_cache_slots_stay_out(paged_batch):
    # Slots outside every context (a freed block that once held an overflowed value, the
    # rest of a row's last block, unused table entries) must not reach the output: decode
    # reads exactly each row's context, and prefill masks what it gathered by overwrite.
    batch = paged_batch([1] * 6 + [9], [3, 17, 18, 40, 41, 90, 30], num_heads=4, num_kv_heads=2,
                        head_dim=32, block_size=16, dtype=torch.float32, seed=3)
    block_size = batch.k_cache.shape[1]
    used = torch.zeros(batch.k_cache.shape[:2], dtype=torch.bool)
    for seq, seq_len in enumerate(batch.seq_lens.tolist()):
        for position in range(seq_len):
            used[batch.block_tables[seq, position // block_size], position % block_size] = True
    batch.k_cache[~used] = float("inf")
    batch.v_cache[~used] = float("nan")
    out = paged_attention_torch(*batch.args())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_reference(batch), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_dot_is_a_gather_then_dot(dtype):
    # The decode path leans on a private aten op; a torch release that changed it fails here.
    gen = torch.Generator().manual_seed(4)
    table = torch.randn(300, 64, generator=gen).to(dtype)
    queries = torch.randn(5, 64, generator=gen).to(dtype)
    sizes = torch.tensor([7, 1, 40, 0, 12])
    rows = torch.randint(0, 300, (int(sizes.sum()),), generator=gen)
    bag_of_sample = torch.repeat_interleave(torch.arange(5), sizes)
    got = gather_dot(queries, table, rows, torch.cumsum(sizes, 0) - sizes, bag_of_sample)
    expected = (queries.float()[bag_of_sample] * table.float()[rows]).sum(-1)
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)
