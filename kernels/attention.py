"""Paged attention over a packed (varlen) batch.

Layout contract (DESIGN.md): per layer `k_cache`/`v_cache` are
`[num_blocks, block_size, num_kv_heads, head_dim]`; sequence b's logical block i
lives in physical block `block_tables[b, i]`.

A packed batch mixes decode rows (one query token) and prefill/extend rows (a
chunk of query tokens whose earlier context is already in the cache). Query
token j of sequence b sits at absolute position `seq_lens[b] - query_len[b] + j`
and attends to cached positions `0..that position` (causal inside the chunk).
The new keys/values must already be written to the cache.
"""

import torch
import torch.nn.functional as F


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
) -> torch.Tensor:
    """Reference: gather each sequence's K/V by block table, pad, and run SDPA.

    q: [num_tokens, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    query_start_loc: [num_seqs + 1] int32; seq_lens: [num_seqs] int32 (context length
    including this step's tokens). Returns [num_tokens, num_heads, head_dim].
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    device = q.device
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens)
    index_in_query = torch.arange(num_tokens, device=device) - query_start_loc[seq_of_token].long()

    num_ctx_blocks = (max_seq_len + block_size - 1) // block_size
    tables = block_tables[:, :num_ctx_blocks].long()
    keys = k_cache[tables].reshape(num_seqs, num_ctx_blocks * block_size, num_kv_heads, head_dim)
    values = v_cache[tables].reshape(num_seqs, num_ctx_blocks * block_size, num_kv_heads, head_dim)

    padded_q = q.new_zeros(num_seqs, max_query_len, num_heads, head_dim)
    padded_q[seq_of_token, index_in_query] = q

    # Key j is visible to query row i when j <= its absolute position (causal)
    # and j < seq_len; padded query rows see key 0 so softmax stays finite.
    context_start = (seq_lens.long() - query_lens)[:, None]
    query_pos = context_start + torch.arange(max_query_len, device=device)[None, :]
    key_pos = torch.arange(keys.shape[1], device=device)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    mask &= key_pos[None, None, :] < seq_lens.long()[:, None, None]
    mask[:, :, 0] = True

    group = num_heads // num_kv_heads
    out = F.scaled_dot_product_attention(
        padded_q.transpose(1, 2),
        keys.transpose(1, 2).repeat_interleave(group, dim=1),
        values.transpose(1, 2).repeat_interleave(group, dim=1),
        attn_mask=mask[:, None, :, :],
        scale=scale,
    ).transpose(1, 2)
    return out[seq_of_token, index_in_query]
