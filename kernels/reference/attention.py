"""Paged attention over a packed (varlen) batch.

Layout contract (docs/architecture/kv-cache.md, "Layout"): per layer `k_cache`/`v_cache` are
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

Options of a layer: `sliding_window` W > 0 lets a query at position p see keys p-W+1..p
only (transformers' sliding-window mask), and only those are read; `soft_cap` c > 0 maps
scores s to c * tanh(s / c) before the softmax (Gemma 2), which SDPA cannot do, so those
prefill chunks run a plain matmul-softmax-matmul. A cache stored in another type than q
(8-bit, `kernels.kv_quant`; or 16-bit under an fp32 model) cannot be read in place: the
rows a step reads are gathered and dequantised (`k_scale`/`v_scale`: a float per tensor
for fp8, the [num_blocks, block_size, num_kv_heads] scales for int8), never the whole cache.
"""

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvdeck.kernels.reference.kv_quant import dequantize
from kvdeck.kernels.reference.step_memo import StepMemo

Scale = float | torch.Tensor | None


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
    sliding_window: int = 0,
    soft_cap: float = 0.0,
    k_scale: Scale = None,
    v_scale: Scale = None,
) -> torch.Tensor:
    """Attend over each sequence's cached context by block table (see the module docstring).

    q: [num_tokens, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    query_start_loc: [num_seqs + 1] int32; seq_lens: [num_seqs] int32 (context length
    including this step's tokens). Returns [num_tokens, num_heads, head_dim].
    """
    plan = _step_plan(block_tables, query_start_loc, seq_lens, k_cache, q.shape[1], max_query_len,
                      sliding_window)
    cache = _Cache(k_cache, v_cache, k_scale, v_scale, scale, soft_cap)
    decode, prefill = plan.decode, plan.prefill
    if prefill is None:
        return _decode_attention(q, cache, decode)
    if decode is None:
        return _prefill_attention(q, cache, prefill)
    out = torch.empty_like(q)
    out.index_copy_(0, plan.decode_tokens, _decode_attention(
        q.index_select(0, plan.decode_tokens), cache, decode))
    out.index_copy_(0, plan.prefill_tokens, _prefill_attention(
        q.index_select(0, plan.prefill_tokens), cache, prefill))
    return out


# ---- attention over a planned step ---------------------------------------------------

@dataclass(slots=True)
class _Cache:
    """One layer's caches and how its scores are formed."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: Scale
    v_scale: Scale
    scale: float
    soft_cap: float

    def in_place(self, q: torch.Tensor) -> bool:
        return self.k_scale is None and self.k.dtype == q.dtype

    def rows(self, which: str, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Cache rows (slot * num_kv_heads + head) as `dtype`, dequantised."""
        cache, scale = (self.k, self.k_scale) if which == "k" else (self.v, self.v_scale)
        head_dim = cache.shape[-1]
        if cache.dtype == dtype:
            return cache.reshape(-1, head_dim).index_select(0, rows)
        # Gathered as bytes: index_select has no fp8 kernel on CPU.
        stored = cache.view(torch.uint8).reshape(-1, head_dim * cache.element_size())
        stored = stored.index_select(0, rows).view(cache.dtype)
        if isinstance(scale, torch.Tensor):
            scale = scale.reshape(-1).index_select(0, rows)
        return dequantize(stored, scale, dtype)

    def cap(self, scores: torch.Tensor) -> torch.Tensor:
        if self.soft_cap > 0:
            return torch.tanh(scores / self.soft_cap) * self.soft_cap
        return scores


def _decode_attention(q, cache: _Cache, plan: "_DecodePlan") -> torch.Tensor:
    """q: [rows, num_heads, head_dim], one query token per row, in the plan's row order."""
    num_seqs, num_heads, head_dim = q.shape
    queries = q.reshape(-1, head_dim)
    if cache.in_place(q):
        keys, key_rows = cache.k.reshape(-1, head_dim), plan.rows
        values, value_rows = cache.v.reshape(-1, head_dim), plan.rows
    else:  # this step's rows only, dequantised, then read in sample order
        keys, key_rows = cache.rows("k", plan.rows, q.dtype), plan.samples
        values, value_rows = cache.rows("v", plan.rows, q.dtype), plan.samples
    scores = gather_dot(queries, keys, key_rows, plan.offsets, plan.bag_of_sample)
    scores = cache.cap(scores.float() * cache.scale)
    # Softmax per (row, head) over its own context: spread on a padded grid, -inf elsewhere.
    grid = torch.full((num_seqs * num_heads, plan.longest), float("-inf"), device=q.device)
    grid.view(-1).index_copy_(0, plan.grid_positions, scores)
    probs = torch.softmax(grid, -1).view(-1).index_select(0, plan.grid_positions)
    out = F.embedding_bag(value_rows, values, plan.offsets, mode="sum",
                          per_sample_weights=probs.to(values.dtype))
    return out.view(num_seqs, num_heads, head_dim)


def _prefill_attention(q, cache: _Cache, layout: "_PrefillLayout") -> torch.Tensor:
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = cache.k.shape[2]
    keys = cache.rows("k", layout.rows, q.dtype)
    values = cache.rows("v", layout.rows, q.dtype)
    out = torch.empty_like(q)
    # One SDPA per chunk, unpadded: a causal chunk without cached context skips the
    # masked half of its tiles, which a padded batch with an explicit mask cannot.
    for chunk in layout.chunks:
        tokens = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        rows = slice(chunk.row_start, chunk.row_start + num_kv_heads * chunk.length)
        chunk_q = q[tokens].transpose(0, 1)[None]
        chunk_k = keys[rows].view(1, num_kv_heads, chunk.length, head_dim)
        chunk_v = values[rows].view(1, num_kv_heads, chunk.length, head_dim)
        if cache.soft_cap > 0:
            attended = _capped_attention(chunk_q, chunk_k, chunk_v, chunk.mask, cache)
        else:
            attended = F.scaled_dot_product_attention(
                chunk_q, chunk_k, chunk_v, attn_mask=chunk.mask, is_causal=chunk.mask is None,
                scale=cache.scale, enable_gqa=num_heads != num_kv_heads,
            )
        out[tokens] = attended[0].transpose(0, 1)
    return out


def _capped_attention(q, k, v, mask: torch.Tensor | None, cache: _Cache) -> torch.Tensor:
    """Attention with soft-capped scores, as transformers' eager path computes it."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = cache.cap(torch.matmul(q, k.transpose(-1, -2)) * cache.scale)
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1, dtype=torch.float32)
    return torch.matmul(probs.to(q.dtype), v)


# ---- the plan: index tensors and masks, built once per step ----------------------------

@dataclass(slots=True)
class _DecodePlan:
    """Every decode row's context as samples of embedding bags: one bag per (row, query
    head), holding the cache rows of its kv head at the positions it sees (0..len-1, or
    the last W with a sliding window)."""

    rows: torch.Tensor  # [samples] cache row (slot * num_kv_heads + kv_head) of each sample
    samples: torch.Tensor  # [samples] 0..samples-1: rows of a gathered (dequantised) copy
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
    length: int  # context positions it reads (from the first one its window sees)
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


# Built by the first layer of a step, reused by the others (one per KV group and window).
_step_plans: StepMemo[_StepPlan] = StepMemo(capacity=8)


def _step_plan(block_tables, query_start_loc, seq_lens, k_cache, num_heads, max_query_len,
               window) -> _StepPlan:
    params = (k_cache.shape[1], k_cache.shape[2], num_heads, window)
    return _step_plans.get((block_tables, query_start_loc, seq_lens), params, lambda: _build_step_plan(
        block_tables, query_start_loc, seq_lens, *params, max_query_len))


def _build_step_plan(block_tables, query_start_loc, seq_lens, block_size, num_kv_heads, num_heads,
                     window, max_query_len) -> _StepPlan:
    if max_query_len == 1:
        return _StepPlan(_decode_plan(block_tables, seq_lens, block_size, num_kv_heads, num_heads,
                                      window))
    starts = query_start_loc.tolist()
    query_lens = [end - start for start, end in zip(starts, starts[1:])]
    lens = seq_lens.tolist()
    decode = [i for i, n in enumerate(query_lens) if n == 1]
    if not decode:
        return _StepPlan(prefill=_prefill_layout(block_tables, starts, query_lens, lens, block_size,
                                                 num_kv_heads, window))
    # A one-token row is a decode whatever its origin: it attends to its whole context.
    device = seq_lens.device
    prefill = [i for i, n in enumerate(query_lens) if n != 1]
    prefill_lens = [query_lens[i] for i in prefill]
    decode_seqs = torch.tensor(decode, device=device)
    return _StepPlan(
        decode=_decode_plan(block_tables.index_select(0, decode_seqs), seq_lens.index_select(0, decode_seqs),
                            block_size, num_kv_heads, num_heads, window),
        prefill=_prefill_layout(block_tables.index_select(0, torch.tensor(prefill, device=device)),
                                [0, *itertools.accumulate(prefill_lens)], prefill_lens,
                                [lens[i] for i in prefill], block_size, num_kv_heads, window),
        decode_tokens=torch.tensor([starts[i] for i in decode], device=device),
        prefill_tokens=torch.cat([torch.arange(starts[i], starts[i + 1], device=device) for i in prefill]),
    )


def _decode_plan(block_tables, seq_lens, block_size: int, num_kv_heads: int, num_heads: int,
                 window: int) -> _DecodePlan:
    device = block_tables.device
    lens = seq_lens.long()
    seen = lens.clamp(max=window) if window > 0 else lens  # the last `window` positions
    sizes = seen.repeat_interleave(num_heads)  # bag (row r, head h) is number r * heads + h
    offsets = torch.cumsum(sizes, 0) - sizes
    num_samples = int(offsets[-1] + sizes[-1])
    bag = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes, output_size=num_samples)
    samples = torch.arange(num_samples, device=device)
    local = samples - offsets[bag]  # index among the positions the row sees
    seq, head = bag // num_heads, bag % num_heads
    position = (lens - seen)[seq] + local
    slot = block_tables[seq, position // block_size].long() * block_size + position % block_size
    kv_head = head // (num_heads // num_kv_heads)
    longest = int(seen.max())
    return _DecodePlan(rows=slot * num_kv_heads + kv_head, samples=samples, offsets=offsets,
                       bag_of_sample=bag, grid_positions=bag * longest + local, longest=longest)


def _cache_rows(block_tables, first: int, end: int, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """The cache row of every (sequence, kv head, first <= position < end), flattened."""
    device = block_tables.device
    pos = torch.arange(first, end, device=device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size
    rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=device)[:, None]
    return rows.reshape(-1)


def _prefill_layout(block_tables, token_starts: list[int], query_lens: list[int], lens: list[int],
                    block_size, num_kv_heads, window: int) -> _PrefillLayout:
    device = block_tables.device
    chunks, rows, row_start = [], [], 0
    for seq, (length, query_len) in enumerate(zip(lens, query_lens)):
        first_query = length - query_len
        # The first key any query of the chunk sees (its window's start for the first query).
        first = max(0, first_query - window + 1) if window > 0 else 0
        mask = None
        if query_len != length or (window > 0 and window < length):
            # Query j sits at position first_query + j and sees keys up to it, and with a
            # window only keys within `window` of it; key i sits at position first + i.
            q_pos = torch.arange(first_query, length, device=device)[:, None]
            k_pos = torch.arange(first, length, device=device)[None, :]
            mask = k_pos <= q_pos
            if window > 0:
                mask &= k_pos > q_pos - window
        chunks.append(_PrefillChunk(token_starts[seq], query_len, row_start, length - first, mask))
        rows.append(_cache_rows(block_tables[seq : seq + 1], first, length, block_size, num_kv_heads))
        row_start += num_kv_heads * (length - first)
    return _PrefillLayout(torch.cat(rows), chunks)
