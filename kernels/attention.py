"""Paged attention over a packed (varlen) batch.

Layout contract (DESIGN.md): per layer `k_cache`/`v_cache` are
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
- keys are gathered by cache row straight into a `[seqs, kv_heads, len, head_dim]`
  layout (contiguous per head, what matmul and SDPA read fastest);
- decode rows of similar length are grouped, so short ones are not padded to the
  longest, and never padded to a prefill chunk's length;
- for fp32 caches, decode's `probs @ V` is one `embedding_bag` over the cache rows for
  all groups: a weighted sum read in place over each row's real context, so V is never
  copied and its padding never read;
- each prefill/extend chunk runs its own unpadded SDPA (causal when it has no cached
  context, so the masked half of the tiles is skipped).
"""

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.step_memo import StepMemo

# A decode group costs a few extra op launches (~50 us on CPU); splitting pays off when
# it saves more than this many bytes of padded keys and values per layer.
GROUP_OVERHEAD_BYTES = 1 << 19
MAX_DECODE_GROUPS = 8


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
    """Gather each sequence's K/V by block table and attend (see the module docstring).

    q: [num_tokens, num_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32;
    query_start_loc: [num_seqs + 1] int32; seq_lens: [num_seqs] int32 (context length
    including this step's tokens). Returns [num_tokens, num_heads, head_dim].
    """
    plan = _step_plan(block_tables, query_start_loc, seq_lens, k_cache, q.shape[1], max_query_len)
    decode, prefill = plan.decode, plan.prefill
    if prefill is None and decode.tokens is None:
        return _decode_attention(q, k_cache, v_cache, decode, scale)
    if decode is None and plan.prefill_tokens is None:
        return _prefill_attention(q, k_cache, v_cache, prefill, scale)
    out = torch.empty_like(q)
    if decode is not None:
        out.index_copy_(0, decode.tokens,
                        _decode_attention(q.index_select(0, decode.tokens), k_cache, v_cache, decode, scale))
    if prefill is not None:
        prefill_q = q.index_select(0, plan.prefill_tokens)
        out.index_copy_(0, plan.prefill_tokens,
                        _prefill_attention(prefill_q, k_cache, v_cache, prefill, scale))
    return out


# ---- attention over a planned step ---------------------------------------------------

def _gather(cache: torch.Tensor, rows: torch.Tensor, num_seqs: int, length: int) -> torch.Tensor:
    # Rows of [slot * num_kv_heads + kv_head, head_dim]: one gather gives any layout.
    head_dim = cache.shape[-1]
    gathered = cache.reshape(-1, head_dim).index_select(0, rows)
    return gathered.view(num_seqs * cache.shape[2], length, head_dim)


def _decode_attention(q, k_cache, v_cache, plan: "_DecodePlan", scale: float) -> torch.Tensor:
    """q: the decode rows in the plan's (length-sorted) order; returns their outputs in it."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    # Query head h reads kv head h // (num_heads / num_kv_heads), so the heads sharing a
    # kv head become that head's query rows: GQA without repeating K/V. With so few query
    # rows a batched matmul beats SDPA's tiled kernel on CPU.
    q = q.reshape(num_seqs * num_kv_heads, num_heads // num_kv_heads, head_dim)
    probs = []
    for group in plan.groups:
        keys = _gather(k_cache, group.rows, group.end - group.start, group.length)
        group_q = q[group.start * num_kv_heads : group.end * num_kv_heads]
        scores = torch.baddbmm(plan.no_bias, group_q, keys.transpose(1, 2), beta=0, alpha=scale)
        if group.mask is not None:
            scores.masked_fill_(group.mask, float("-inf"))
        probs.append(torch.softmax(scores, -1, dtype=torch.float32))
    if v_cache.dtype == torch.float32:
        # probs @ V as a weighted sum of cache rows (embedding_bag) for every group at once,
        # over each row's real context only: V is read once, in place, and never padded.
        weights = probs[0].view(-1) if len(probs) == 1 else torch.cat([p.view(-1) for p in probs])
        if plan.real_probs is not None:
            weights = weights.index_select(0, plan.real_probs)
        out = F.embedding_bag(plan.value_rows, v_cache.reshape(-1, head_dim), plan.value_offsets,
                              mode="sum", per_sample_weights=weights)
    else:
        out = torch.cat([
            torch.bmm(p.to(q.dtype), _gather(v_cache, group.rows, group.end - group.start, group.length))
            for group, p in zip(plan.groups, probs)
        ])
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
class _DecodeGroup:
    """A run of the length-sorted decode rows, attended together, padded to the longest."""

    start: int  # rows start..end of the plan's order
    end: int
    length: int
    rows: torch.Tensor  # cache rows of [seqs, kv_heads, length]
    mask: torch.Tensor | None  # [seqs * kv_heads, 1, length], True past a row's end; None if none ends early


@dataclass(slots=True)
class _DecodePlan:
    groups: list[_DecodeGroup]
    tokens: torch.Tensor | None  # q row of each decode row, in the plan's order; None: q as it is
    no_bias: torch.Tensor  # baddbmm's input, ignored (beta=0) but required
    # fp32 caches: probs @ V as an embedding_bag. The V row of every (row, query head,
    # position < the row's length), one bag per (row, head), and where those weights sit
    # among the groups' padded probs (None when no group is padded).
    value_rows: torch.Tensor | None = None
    value_offsets: torch.Tensor | None = None
    real_probs: torch.Tensor | None = None


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
    prefill_tokens: torch.Tensor | None = None  # q rows of the prefill part when the batch mixes both


# Built by the first layer of a step, reused by the others.
_step_plans: StepMemo[_StepPlan] = StepMemo()


def _step_plan(block_tables, query_start_loc, seq_lens, k_cache, num_heads, max_query_len) -> _StepPlan:
    params = (*k_cache.shape[1:], k_cache.dtype, num_heads)
    return _step_plans.get((block_tables, query_start_loc, seq_lens), params, lambda: _build_step_plan(
        block_tables, query_start_loc, seq_lens, *params, max_query_len))


def _build_step_plan(block_tables, query_start_loc, seq_lens, block_size, num_kv_heads, head_dim,
                     dtype, num_heads, max_query_len) -> _StepPlan:
    shape = _HeadShape(block_size, num_kv_heads, num_heads, head_dim, dtype)
    if max_query_len == 1:
        return _StepPlan(_decode_plan(block_tables, seq_lens.tolist(), None, shape))
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
    return _StepPlan(
        decode=_decode_plan(block_tables.index_select(0, torch.tensor(decode, device=device)),
                            [lens[i] for i in decode], [starts[i] for i in decode], shape),
        prefill=_prefill_layout(block_tables.index_select(0, torch.tensor(prefill, device=device)),
                                [0, *itertools.accumulate(prefill_lens)], prefill_lens,
                                [lens[i] for i in prefill], block_size, num_kv_heads),
        prefill_tokens=torch.cat([torch.arange(starts[i], starts[i + 1], device=device) for i in prefill]),
    )


@dataclass(frozen=True, slots=True)
class _HeadShape:
    block_size: int
    num_kv_heads: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype


def _cache_rows(block_tables, length: int, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """The cache row of every (sequence, kv head, position < length), flattened."""
    device = block_tables.device
    pos = torch.arange(length, device=device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size
    rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=device)[:, None]
    return rows.reshape(-1)


def _length_runs(lens: list[int], bytes_per_slot: int) -> list[tuple[int, int]]:
    """Runs (start, end) of the rows sorted by length, evenly split; the split count with
    the fewest padded bytes plus per-group overhead wins."""
    def runs(count: int) -> list[tuple[int, int]]:
        size = -(-len(lens) // count)
        return [(start, min(start + size, len(lens))) for start in range(0, len(lens), size)]

    def cost(count: int) -> int:
        return sum((end - start) * lens[end - 1] * bytes_per_slot + GROUP_OVERHEAD_BYTES
                   for start, end in runs(count))

    return runs(min(range(1, min(MAX_DECODE_GROUPS, len(lens)) + 1), key=cost))


def _decode_plan(block_tables, lens: list[int], tokens: list[int] | None, shape: _HeadShape) -> _DecodePlan:
    """Decode rows (`tokens`: each one's q row; None: row i is q row i) grouped by length."""
    device = block_tables.device
    order = sorted(range(len(lens)), key=lens.__getitem__)
    bytes_per_slot = 2 * shape.num_kv_heads * shape.head_dim * shape.dtype.itemsize
    runs = _length_runs([lens[i] for i in order], bytes_per_slot)
    if len(runs) == 1:  # one group: the rows can stay in their own order
        order = list(range(len(lens)))
    shuffled = order != sorted(order)
    if shuffled:
        block_tables = block_tables.index_select(0, torch.tensor(order, device=device))
        lens = [lens[i] for i in order]
    q_rows = None
    if tokens is not None:
        q_rows = torch.tensor([tokens[i] for i in order], device=device)
    elif shuffled:
        q_rows = torch.tensor(order, device=device)
    groups = []
    for start, end in runs:
        length = max(lens[start:end])
        mask = None
        if min(lens[start:end]) != length:
            ends = torch.tensor(lens[start:end], device=device)
            past_end = torch.arange(length, device=device) >= ends[:, None]
            mask = past_end[:, None, None, :].expand(-1, shape.num_kv_heads, 1, -1).reshape(-1, 1, length)
        rows = _cache_rows(block_tables[start:end], length, shape.block_size, shape.num_kv_heads)
        groups.append(_DecodeGroup(start, end, length, rows, mask))
    plan = _DecodePlan(groups, q_rows, torch.zeros(1, 1, 1, dtype=shape.dtype, device=device))
    if shape.dtype == torch.float32:
        _plan_value_bags(plan, lens, shape)
    return plan


def _plan_value_bags(plan: _DecodePlan, lens: list[int], shape: _HeadShape) -> None:
    device = plan.no_bias.device
    heads_per_kv = shape.num_heads // shape.num_kv_heads
    kv_head = torch.arange(shape.num_heads, device=device) // heads_per_kv
    row_starts, prob_starts, row_base, prob_base = [], [], 0, 0
    for group in plan.groups:
        seqs = group.end - group.start
        # Bag (row i, head h) reads the group's cache rows [i, h's kv head, :length] and
        # weights [i, h, :length] of the group's probs, flattened back to back.
        local_rows = torch.arange(seqs, device=device)[:, None] * shape.num_kv_heads + kv_head
        row_starts.append(row_base + local_rows.view(-1) * group.length)
        prob_starts.append(prob_base + torch.arange(seqs * shape.num_heads, device=device) * group.length)
        row_base += seqs * shape.num_kv_heads * group.length
        prob_base += seqs * shape.num_heads * group.length
    sizes = torch.tensor(lens, device=device).repeat_interleave(shape.num_heads)
    all_rows = torch.cat([group.rows for group in plan.groups])
    plan.value_rows = all_rows.index_select(0, _ragged_arange(torch.cat(row_starts), sizes))
    plan.value_offsets = torch.cumsum(sizes, 0) - sizes
    if any(group.mask is not None for group in plan.groups):
        plan.real_probs = _ragged_arange(torch.cat(prob_starts), sizes)


def _ragged_arange(starts: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """arange(start, start + size) for each pair, concatenated."""
    offsets = torch.cumsum(sizes, 0) - sizes
    total = int(offsets[-1] + sizes[-1])
    shifts = torch.repeat_interleave(starts - offsets, sizes, output_size=total)
    return torch.arange(total, device=sizes.device) + shifts


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
