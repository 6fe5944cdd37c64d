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
- for fp32 caches, decode's `probs @ V` is an `embedding_bag` over the cache rows:
  a weighted sum read in place, so V is never copied;
- each prefill/extend chunk runs its own unpadded SDPA (causal when it has no cached
  context, so the masked half of the tiles is skipped).
"""

import itertools
from dataclasses import dataclass, field

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
    plan = _step_plan(block_tables, query_start_loc, seq_lens, k_cache, max_query_len)
    if plan.prefill is None:
        return _decode_attention(q, k_cache, v_cache, plan.decode_groups, scale)
    if not plan.decode_groups:
        return _prefill_attention(q, k_cache, v_cache, plan.prefill, scale)
    out = torch.empty_like(q)
    decode_q = q.index_select(0, plan.decode_tokens)
    out.index_copy_(0, plan.decode_tokens,
                    _decode_attention(decode_q, k_cache, v_cache, plan.decode_groups, scale))
    prefill_q = q.index_select(0, plan.prefill_tokens)
    out.index_copy_(0, plan.prefill_tokens,
                    _prefill_attention(prefill_q, k_cache, v_cache, plan.prefill, scale))
    return out


# ---- attention over a planned step ---------------------------------------------------

def _gather(cache: torch.Tensor, rows: torch.Tensor, num_seqs: int, length: int) -> torch.Tensor:
    # Rows of [slot * num_kv_heads + kv_head, head_dim]: one gather gives any layout.
    head_dim = cache.shape[-1]
    gathered = cache.reshape(-1, head_dim).index_select(0, rows)
    return gathered.view(num_seqs, cache.shape[2], length, head_dim)


def _decode_attention(q, k_cache, v_cache, groups: list["_DecodeGroup"], scale: float) -> torch.Tensor:
    if len(groups) == 1 and groups[0].seqs is None:
        return _attend_decode_group(q, k_cache, v_cache, groups[0], scale)
    out = torch.empty_like(q)
    for group in groups:
        attended = _attend_decode_group(q.index_select(0, group.seqs), k_cache, v_cache, group, scale)
        out.index_copy_(0, group.seqs, attended)
    return out


def _attend_decode_group(q, k_cache, v_cache, group: "_DecodeGroup", scale: float) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys = _gather(k_cache, group.rows, num_seqs, group.length)
    # Query head h reads kv head h // (num_heads / num_kv_heads), so the heads sharing a
    # kv head become that head's query rows: GQA without repeating K/V. With so few query
    # rows a batched matmul beats SDPA's tiled kernel on CPU.
    scores = torch.matmul(q.view(num_seqs, num_kv_heads, -1, head_dim), keys.transpose(-1, -2))
    scores.mul_(scale)
    if group.mask is not None:
        scores.masked_fill_(group.mask, float("-inf"))
    probs = torch.softmax(scores, -1, dtype=torch.float32)
    if v_cache.dtype == torch.float32:
        # probs @ V as a weighted sum of cache rows (embedding_bag): V is read once, in
        # place, instead of being gathered into a copy and read again.
        rows, offsets = group.bags(num_heads // num_kv_heads)
        out = F.embedding_bag(rows, v_cache.reshape(-1, head_dim), offsets, mode="sum",
                              per_sample_weights=probs.view(-1))
    else:
        out = torch.matmul(probs.to(q.dtype), _gather(v_cache, group.rows, num_seqs, group.length))
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
    """Decode rows attended together, padded to the longest of them."""

    length: int
    rows: torch.Tensor  # cache rows of [seqs, kv_heads, length]
    mask: torch.Tensor | None  # [seqs, 1, 1, length], True past a row's end; None if none ends early
    seqs: torch.Tensor | None  # which decode rows; None for all of them, in order
    _bags: tuple | None = None

    def bags(self, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows` once per query head, and bag offsets: the embedding_bag form of probs @ V."""
        if self._bags is None or self._bags[0] != group_size:
            rows = self.rows.view(-1, 1, self.length).expand(-1, group_size, self.length).reshape(-1)
            offsets = torch.arange(0, rows.numel(), self.length, device=rows.device)
            self._bags = (group_size, rows, offsets)
        return self._bags[1], self._bags[2]


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
    decode_groups: list[_DecodeGroup] = field(default_factory=list)
    prefill: _PrefillLayout | None = None
    # Token rows of each part when the batch mixes both.
    decode_tokens: torch.Tensor | None = None
    prefill_tokens: torch.Tensor | None = None


# Built by the first layer of a step, reused by the others.
_step_plans: StepMemo[_StepPlan] = StepMemo()


def _step_plan(block_tables, query_start_loc, seq_lens, k_cache, max_query_len) -> _StepPlan:
    params = (k_cache.shape[1], k_cache.shape[2], k_cache.shape[3], k_cache.element_size())
    return _step_plans.get((block_tables, query_start_loc, seq_lens), params, lambda: _build_step_plan(
        block_tables, query_start_loc, seq_lens, *params, max_query_len))


def _build_step_plan(block_tables, query_start_loc, seq_lens, block_size, num_kv_heads, head_dim,
                     element_size, max_query_len) -> _StepPlan:
    bytes_per_slot = 2 * num_kv_heads * head_dim * element_size
    if max_query_len == 1:
        return _StepPlan(_decode_groups(block_tables, seq_lens.tolist(), block_size, num_kv_heads,
                                        bytes_per_slot))
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
    decode_seqs = torch.tensor(decode, device=device)
    prefill_lens = [query_lens[i] for i in prefill]
    return _StepPlan(
        decode_groups=_decode_groups(block_tables.index_select(0, decode_seqs),
                                     [lens[i] for i in decode], block_size, num_kv_heads, bytes_per_slot),
        prefill=_prefill_layout(block_tables.index_select(0, torch.tensor(prefill, device=device)),
                                [0, *itertools.accumulate(prefill_lens)], prefill_lens,
                                [lens[i] for i in prefill], block_size, num_kv_heads),
        decode_tokens=torch.tensor([starts[i] for i in decode], device=device),
        prefill_tokens=torch.cat([torch.arange(starts[i], starts[i + 1], device=device) for i in prefill]),
    )


def _cache_rows(block_tables, length: int, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """The cache row of every (sequence, kv head, position < length), flattened."""
    device = block_tables.device
    pos = torch.arange(length, device=device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size
    rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads, device=device)[:, None]
    return rows.reshape(-1)


def _decode_groups(block_tables, lens: list[int], block_size, num_kv_heads,
                   bytes_per_slot) -> list[_DecodeGroup]:
    order = sorted(range(len(lens)), key=lens.__getitem__)

    # Runs of the length-sorted rows, evenly split; the split count with the fewest
    # padded bytes plus per-group overhead wins.
    def runs(count: int) -> list[list[int]]:
        size = -(-len(order) // count)
        return [order[start : start + size] for start in range(0, len(order), size)]

    def cost(count: int) -> int:
        return sum(len(run) * lens[run[-1]] * bytes_per_slot + GROUP_OVERHEAD_BYTES for run in runs(count))

    best = min(range(1, min(MAX_DECODE_GROUPS, len(order)) + 1), key=cost)
    if best == 1:  # all rows in their own order: nothing to shuffle
        return [_decode_group(block_tables, lens, None, block_size, num_kv_heads)]
    return [_decode_group(block_tables, lens, run, block_size, num_kv_heads) for run in runs(best)]


def _decode_group(block_tables, lens: list[int], members: list[int] | None, block_size: int,
                  num_kv_heads: int) -> _DecodeGroup:
    device = block_tables.device
    seqs = None
    if members is not None:
        seqs = torch.tensor(members, device=device)
        block_tables, lens = block_tables.index_select(0, seqs), [lens[i] for i in members]
    length = max(lens)
    mask = None
    if min(lens) != length:
        pos = torch.arange(length, device=device)
        mask = (pos[None, :] >= torch.tensor(lens, device=device)[:, None])[:, None, None, :]
    return _DecodeGroup(length, _cache_rows(block_tables, length, block_size, num_kv_heads), mask, seqs)


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
