"""Paged attention over a packed (varlen) batch.

Layout contract (docs/ARCHITECTURE.md, "KV cache layout"): per layer `k_cache`/`v_cache` are
`[num_blocks, block_size, num_kv_heads, head_dim]`; sequence b's logical block i
lives in physical block `block_tables[b, i]`.

A packed batch mixes decode rows (one query token) and prefill/extend rows (a
chunk of query tokens whose earlier context is already in the cache). Query
token j of sequence b sits at absolute position `seq_lens[b] - query_len[b] + j`
and attends to cached positions `0..that position` (causal inside the chunk).
The new keys/values must already be written to the cache.

This is the reference the Triton kernel is tested against, and the CPU path. On CPU
attention is memory-bound, so the step is planned once for all layers to move few
bytes:
- a decode row reads its context in place, exactly once and unpadded: the scores are
  one dot product per (head, cached position), which is what embedding_bag's
  per-sample-weights gradient computes (the query as the bag's gradient, the cache as
  the table); a softmax over each row's scores; then `probs @ V` is an embedding_bag
  over the same rows (a weighted sum of cache rows). Neither K nor V is copied;
- each prefill/extend chunk gathers its context and runs its own unpadded SDPA (causal
  when it has no cached context, so the masked half of the tiles is skipped).
"""

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvdeck.kernels.step_memo import StepMemo


def gather_dot(queries: torch.Tensor, table: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor,
               bag_of_sample: torch.Tensor) -> torch.Tensor:
    """`queries[bag_of_sample[i]] . table[rows[i]]` for every sample i, reading the table in
    place: the gradient of embedding_bag's per-sample weights (mode 0 = sum, no padding
    index) is exactly this gather-dot, and aten has it as a parallel CPU kernel."""
    return torch.ops.aten._embedding_bag_per_sample_weights_backward(
        queries, table, rows, offsets, bag_of_sample, 0, -1)


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
    """Attend over each sequence's cached context by block table (see the module docstring).

    q: [num_tokens, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    query_start_loc: [num_seqs + 1] int32; seq_lens: [num_seqs] int32 (context length
    including this step's tokens). Returns [num_tokens, num_heads, head_dim].
    """
    plan = _step_plan(block_tables, query_start_loc, seq_lens, k_cache, q.shape[1], max_query_len)
    decode, prefill = plan.decode, plan.prefill
    if prefill is None:
        return _decode_attention(q, k_cache, v_cache, decode, scale)
    if decode is None:
        return _prefill_attention(q, k_cache, v_cache, prefill, scale)
    out = torch.empty_like(q)
    out.index_copy_(0, plan.decode_tokens, _decode_attention(
        q.index_select(0, plan.decode_tokens), k_cache, v_cache, decode, scale))
    out.index_copy_(0, plan.prefill_tokens, _prefill_attention(
        q.index_select(0, plan.prefill_tokens), k_cache, v_cache, prefill, scale))
    return out


# ---- attention over a planned step ---------------------------------------------------

def _decode_attention(q, k_cache, v_cache, plan: "_DecodePlan", scale: float) -> torch.Tensor:
    """q: [rows, num_heads, head_dim], one query token per row, in the plan's row order."""
    num_seqs, num_heads, head_dim = q.shape
    scores = gather_dot(q.reshape(-1, head_dim), k_cache.reshape(-1, head_dim), plan.rows,
                        plan.offsets, plan.bag_of_sample)
    # Softmax per (row, head) over its own context: spread on a padded grid, -inf elsewhere.
    grid = torch.full((num_seqs * num_heads, plan.longest), float("-inf"), device=q.device)
    grid.view(-1).index_copy_(0, plan.grid_positions, scores.float())
    probs = torch.softmax(grid.mul_(scale), -1).view(-1).index_select(0, plan.grid_positions)
    out = F.embedding_bag(plan.rows, v_cache.reshape(-1, head_dim), plan.offsets, mode="sum",
                          per_sample_weights=probs.to(v_cache.dtype))
    return out.view(num_seqs, num_heads, head_dim)


def _prefill_attention(q, k_cache, v_cache, layout: "_PrefillLayout", scale: float) -> torch.Tensor:
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    keys = k_cache.reshape(-1, head_dim).index_select(0, layout.rows)
    values = v_cache.reshape(-1, head_dim).index_select(0, layout.rows)
    out = torch.empty_like(q)
    # One SDPA per chunk, unpadded: a causal chunk without cached context skips the
    # masked half of its tiles, which a padded batch with an explicit mask cannot.
    for chunk in layout.chunks:
        tokens = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        rows = slice(chunk.row_start, chunk.row_start + num_kv_heads * chunk.length)
        attended = F.scaled_dot_product_attention(
            q[tokens].transpose(0, 1)[None],
            keys[rows].view(1, num_kv_heads, chunk.length, head_dim),
            values[rows].view(1, num_kv_heads, chunk.length, head_dim),
            attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        out[tokens] = attended[0].transpose(0, 1)
    return out


# ---- the plan: index tensors and masks, built once per step ----------------------------

@dataclass(slots=True)
class _DecodePlan:
    """Every decode row's context as samples of embedding bags: one bag per (row, query
    head), holding the cache rows of its kv head at positions 0..len-1."""

    rows: torch.Tensor  # [samples] cache row (slot * num_kv_heads + kv_head) of each sample
    offsets: torch.Tensor  # [bags] first sample of each bag
    bag_of_sample: torch.Tensor  # [samples]
    grid_positions: torch.Tensor  # [samples] bag * longest + position: where softmax sees it
    longest: int


@dataclass(slots=True)
class _PrefillChunk:
    """One sequence's prefill or extend chunk: its query tokens and its context."""

    token_start: int
    query_len: int
    row_start: int  # its [kv_heads, length] cache rows start here in the layout's rows
    length: int
    mask: torch.Tensor | None  # [query_len, length], True where visible; None: plain causal


@dataclass(slots=True)
class _PrefillLayout:
    rows: torch.Tensor  # every chunk's cache rows, back to back
    chunks: list[_PrefillChunk]


@dataclass(slots=True)
class _StepPlan:
    decode: _DecodePlan | None = None
    prefill: _PrefillLayout | None = None
    # q rows of each part when the batch mixes both.
    decode_tokens: torch.Tensor | None = None
    prefill_tokens: torch.Tensor | None = None


# Built by the first layer of a step, reused by the others.
_step_plans: StepMemo[_StepPlan] = StepMemo()


def _step_plan(block_tables, query_start_loc, seq_lens, k_cache, num_heads, max_query_len) -> _StepPlan:
    params = (k_cache.shape[1], k_cache.shape[2], num_heads)
    return _step_plans.get((block_tables, query_start_loc, seq_lens), params, lambda: _build_step_plan(
        block_tables, query_start_loc, seq_lens, *params, max_query_len))


def _build_step_plan(block_tables, query_start_loc, seq_lens, block_size, num_kv_heads, num_heads,
                     max_query_len) -> _StepPlan:
    if max_query_len == 1:
        return _StepPlan(_decode_plan(block_tables, seq_lens, block_size, num_kv_heads, num_heads))
    starts = query_start_loc.tolist()
    query_lens = [end - start for start, end in zip(starts, starts[1:])]
    lens = seq_lens.tolist()
    decode = [i for i, n in enumerate(query_lens) if n == 1]
    if not decode:
        return _StepPlan(prefill=_prefill_layout(block_tables, starts, query_lens, lens, block_size,
                                                 num_kv_heads))
    # A one-token row is a decode whatever its origin: it attends to its whole context.
    device = seq_lens.device
    prefill = [i for i, n in enumerate(query_lens) if n != 1]
    prefill_lens = [query_lens[i] for i in prefill]
    decode_seqs = torch.tensor(decode, device=device)
    return _StepPlan(
        decode=_decode_plan(block_tables.index_select(0, decode_seqs), seq_lens.index_select(0, decode_seqs),
                            block_size, num_kv_heads, num_heads),
        prefill=_prefill_layout(block_tables.index_select(0, torch.tensor(prefill, device=device)),
                                [0, *itertools.accumulate(prefill_lens)], prefill_lens,
                                [lens[i] for i in prefill], block_size, num_kv_heads),
        decode_tokens=torch.tensor([starts[i] for i in decode], device=device),
        prefill_tokens=torch.cat([torch.arange(starts[i], starts[i + 1], device=device) for i in prefill]),
    )


def _decode_plan(block_tables, seq_lens, block_size: int, num_kv_heads: int, num_heads: int) -> _DecodePlan:
    device = block_tables.device
    sizes = seq_lens.long().repeat_interleave(num_heads)  # bag (row r, head h) is number r * heads + h
    offsets = torch.cumsum(sizes, 0) - sizes
    num_samples = int(offsets[-1] + sizes[-1])
    bag = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes, output_size=num_samples)
    position = torch.arange(num_samples, device=device) - offsets[bag]
    seq, head = bag // num_heads, bag % num_heads
    slot = block_tables[seq, position // block_size].long() * block_size + position % block_size
    kv_head = head // (num_heads // num_kv_heads)
    longest = int(seq_lens.max())
    return _DecodePlan(rows=slot * num_kv_heads + kv_head, offsets=offsets, bag_of_sample=bag,
                       grid_positions=bag * longest + position, longest=longest)


def _cache_rows(block_tables, length: int, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """The cache row of every (sequence, kv head, position < length), flattened."""
    device = block_tables.device
    pos = torch.arange(length, device=device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size
    rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=device)[:, None]
    return rows.reshape(-1)


def _prefill_layout(block_tables, token_starts: list[int], query_lens: list[int], lens: list[int],
                    block_size, num_kv_heads) -> _PrefillLayout:
    device = block_tables.device
    chunks, rows, row_start = [], [], 0
    for seq, (length, query_len) in enumerate(zip(lens, query_lens)):
        mask = None
        if query_len != length:
            # Query j sits at position length - query_len + j and sees keys up to it.
            mask = torch.ones(query_len, length, dtype=torch.bool, device=device)
            mask = mask.tril(diagonal=length - query_len)
        chunks.append(_PrefillChunk(token_starts[seq], query_len, row_start, length, mask))
        rows.append(_cache_rows(block_tables[seq : seq + 1], length, block_size, num_kv_heads))
        row_start += num_kv_heads * length
    return _PrefillLayout(torch.cat(rows), chunks)
