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

import weakref
from dataclasses import dataclass

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
    layout = _batch_layout(block_tables, query_start_loc, seq_lens, num_tokens, block_size,
                           max_query_len, max_seq_len)
    num_seqs = seq_lens.shape[0]
    keys = k_cache[layout.tables].reshape(num_seqs, -1, num_kv_heads, head_dim)
    values = v_cache[layout.tables].reshape(num_seqs, -1, num_kv_heads, head_dim)
    if layout.decode_only:
        padded_q = q[:, None]  # one query per sequence: no padding needed
    else:
        padded_q = q.new_zeros(num_seqs, max_query_len, num_heads, head_dim)
        padded_q[layout.seq_of_token, layout.index_in_query] = q
    out = F.scaled_dot_product_attention(
        padded_q.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=layout.mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    ).transpose(1, 2)
    if layout.decode_only:
        return out[:, 0]
    return out[layout.seq_of_token, layout.index_in_query]


@dataclass(slots=True)
class _BatchLayout:
    """Index tensors and the mask of one packed batch; the same for every layer of a step."""

    sources: tuple[weakref.ref, ...]
    tables: torch.Tensor
    mask: torch.Tensor
    decode_only: bool
    seq_of_token: torch.Tensor | None = None
    index_in_query: torch.Tensor | None = None


_last_layout: list[_BatchLayout] = []


def _batch_layout(block_tables, query_start_loc, seq_lens, num_tokens, block_size,
                  max_query_len, max_seq_len) -> _BatchLayout:
    # The runner builds these tensors once per step; identity (through weak references,
    # so a freed tensor can never match) tells that a later layer sees the same batch.
    sources = (block_tables, query_start_loc, seq_lens)
    if _last_layout:
        cached = _last_layout[0]
        if all(ref() is t for ref, t in zip(cached.sources, sources)):
            return cached
    num_seqs = seq_lens.shape[0]
    device = seq_lens.device
    num_ctx_blocks = (max_seq_len + block_size - 1) // block_size
    tables = block_tables[:, :num_ctx_blocks].long()
    key_pos = torch.arange(num_ctx_blocks * block_size, device=device)
    lens = seq_lens.long()
    decode_only = max_query_len == 1 and num_tokens == num_seqs
    if decode_only:
        mask = (key_pos[None, :] < lens[:, None])[:, None, None, :]
        layout = _BatchLayout(tuple(weakref.ref(t) for t in sources), tables, mask, True)
    else:
        query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens)
        index_in_query = torch.arange(num_tokens, device=device) - query_start_loc[seq_of_token].long()
        # Key j is visible to query row i when j <= its absolute position (causal)
        # and j < seq_len; padded query rows see key 0 so softmax stays finite.
        query_pos = (lens - query_lens)[:, None] + torch.arange(max_query_len, device=device)[None, :]
        mask = key_pos[None, None, :] <= query_pos[:, :, None]
        mask &= key_pos[None, None, :] < lens[:, None, None]
        mask[:, :, 0] = True
        layout = _BatchLayout(tuple(weakref.ref(t) for t in sources), tables, mask[:, None],
                              False, seq_of_token, index_in_query)
    _last_layout[:] = [layout]
    return layout
