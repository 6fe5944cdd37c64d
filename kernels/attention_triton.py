"""Triton paged attention for the packed batch (decode + prefill/extend in one launch).

One program owns BLOCK_Q query tokens of one sequence and all GROUP query heads that
share one KV head, so each K/V tile read through the block table serves GROUP * BLOCK_Q
rows (GQA). Programs walk the sequence's KV range in tiles of TILE_N tokens with an
online softmax in fp32. When few sequences decode long contexts, the KV range is split
into NUM_SEGMENTS (flash-decoding); partial results are merged by log-sum-exp in a
second small kernel. Semantics match `kernels.attention.paged_attention_torch`.

Decode rows (one query token) and chunk rows (prefill/extend) get launches of their own
with their own tiles: a decode launch has one program per sequence and serves only
sequences with one query token; a chunk launch walks q blocks and serves the rest. A
decode-only batch is one decode launch; any other batch is both, so the decode rows of
a mixed batch do not fill a 64-row prefill tile with one token. Which rows a sequence
has is read on the device (no host sync).

Kept importable only through `kernels.triton_ops`: `triton.jit` decides compiled vs
interpreted at import time, so TRITON_INTERPRET must be set before this module loads.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.attention_tuning import (
    AttentionConfig,
    choose_num_segments,
    default_config,
    streaming_multiprocessors,
)

LOG2_E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, q_block_global, BLOCK_Q: tl.constexpr):
    # Sequence s owns q blocks from query_start_loc[s] // BLOCK_Q + s on (strictly
    # increasing in s), so the grid needs no host-side index and no device sync.
    lo: tl.int32 = 0  # typed so the loop-carried value keeps one type when compiled
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc, l_i, m_i, q, query_pos, tile_lo, tile_hi, kv_end, bt_row, k_head_ptr, v_head_ptr,
    stride_k_blk, stride_k_slot, stride_v_blk, stride_v_slot, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, COMPUTE_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online-softmax update over KV tiles [tile_lo, tile_hi) read through the block table."""
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM
    for tile in range(tile_lo, tile_hi):
        kpos = tile * TILE_N + tl.arange(0, TILE_N)
        kv_valid = kpos < kv_end
        if MASKED:
            kv_mask = kv_valid
        else:  # every key of the tile exists and is visible to every row
            kv_mask = kpos >= 0
        block_id = tl.load(bt_row + kpos // BLOCK_SIZE, mask=kv_mask, other=0).to(tl.int64)
        in_block = kpos % BLOCK_SIZE
        k_off = block_id * stride_k_blk + in_block * stride_k_slot
        v_off = block_id * stride_v_blk + in_block * stride_v_slot
        if MASKED or HEAD_DIM != HEAD_DIM_PAD:
            k = tl.load(k_head_ptr + k_off[None, :] + dims[:, None],
                        mask=dim_valid[:, None] & kv_mask[None, :], other=0.0)
            v = tl.load(v_head_ptr + v_off[:, None] + dims[None, :],
                        mask=kv_mask[:, None] & dim_valid[None, :], other=0.0)
        else:
            k = tl.load(k_head_ptr + k_off[None, :] + dims[:, None])
            v = tl.load(v_head_ptr + v_off[:, None] + dims[None, :])
        if COMPUTE_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = (kpos[None, :] <= query_pos[:, None]) & kv_valid[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep -inf; subtract 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr,
    seq_lens_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    qk_scale, num_seqs,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_k_blk, stride_k_slot, stride_k_head,
    stride_v_blk, stride_v_slot, stride_v_head,
    stride_bt_seq, num_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, COMPUTE_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DECODE_ROWS: tl.constexpr,
):
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    if DECODE_ROWS:  # program i is sequence i, served if it has exactly one query token
        seq = tl.program_id(0)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_block_local = 0
        skip = q_len != 1
    else:  # q blocks of sequences with more than one query token
        q_block_global = tl.program_id(0)
        seq = _find_seq(query_start_loc_ptr, num_seqs, q_block_global, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_block_local = q_block_global - (q_start // BLOCK_Q + seq)
        skip = (q_len == 1) | (q_block_local * BLOCK_Q >= q_len)
    if skip:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_local = q_block_local * BLOCK_Q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_local < q_len)
    token = (q_start + q_local).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM

    q_mask = row_valid[:, None] & dim_valid[None, :]
    q = tl.load(
        q_ptr + token[:, None] * stride_q_tok + head[:, None] * stride_q_head + dims[None, :],
        mask=q_mask, other=0.0,
    )
    if COMPUTE_F32:
        q = q.to(tl.float32)
    query_pos = context_len + q_local

    # Causal: the last row of this q block sees keys up to its own position.
    kv_end = tl.minimum(seq_len, context_len + (q_block_local + 1) * BLOCK_Q)
    num_tiles = (kv_end + TILE_N - 1) // TILE_N
    tiles_per_segment = (num_tiles + NUM_SEGMENTS - 1) // NUM_SEGMENTS
    tile_begin = segment * tiles_per_segment
    tile_stop = tl.minimum(tile_begin + tiles_per_segment, num_tiles)

    # Tiles wholly at or below the block's first query position need no mask (the fast
    # path); the rest (diagonal, tail of the sequence) are masked.
    first_masked_tile = (context_len + q_block_local * BLOCK_Q + 1) // TILE_N
    split_tile = tl.maximum(tl.minimum(first_masked_tile, tile_stop), tile_begin)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, query_pos, tile_begin, split_tile, kv_end, bt_row, k_head_ptr,
        v_head_ptr, stride_k_blk, stride_k_slot, stride_v_blk, stride_v_slot, qk_scale,
        HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, COMPUTE_F32, DOT_PRECISION, False,
    )
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, query_pos, split_tile, tile_stop, kv_end, bt_row, k_head_ptr,
        v_head_ptr, stride_k_blk, stride_k_slot, stride_v_blk, stride_v_slot, qk_scale,
        HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, COMPUTE_F32, DOT_PRECISION, True,
    )

    if NUM_SEGMENTS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_o_tok + head[:, None] * stride_o_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty), mask=q_mask,
        )
    else:
        part_row = (token * num_heads + head) * NUM_SEGMENTS + segment
        tl.store(part_max_ptr + part_row, m_i, mask=row_valid)
        tl.store(part_sum_ptr + part_row, l_i, mask=row_valid)
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM_PAD + dims[None, :], acc, mask=q_mask
        )


@triton.jit
def _merge_segments_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    stride_o_tok, stride_o_head, num_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    segments = tl.arange(0, NUM_SEGMENTS)
    dims = tl.arange(0, HEAD_DIM_PAD)
    base = (token * num_heads + head) * NUM_SEGMENTS
    m = tl.load(part_max_ptr + base + segments)
    l_seg = tl.load(part_sum_ptr + base + segments)
    dim_valid = dims < HEAD_DIM
    acc = tl.load(part_out_ptr + (base + segments)[:, None] * HEAD_DIM_PAD + dims[None, :],
                  mask=dim_valid[None, :], other=0.0)
    m_max = tl.max(m, 0)
    # Empty segments carry m = -inf and contribute weight 0.
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(weight * l_seg, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token * stride_o_tok + head * stride_o_head + dims,
        out.to(out_ptr.dtype.element_ty), mask=dim_valid,
    )


def _check_inputs(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens) -> None:
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim] with unit last stride, "
                         f"got shape {tuple(q.shape)} strides {q.stride()}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, "
                         f"head_dim], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache need a unit stride in head_dim")
    if k_cache.shape[3] != q.shape[2] or q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(f"q heads/head_dim {tuple(q.shape[1:])} do not fit the cache's "
                         f"num_kv_heads/head_dim {tuple(k_cache.shape[2:])}")
    for name, t in (("block_tables", block_tables), ("query_start_loc", query_start_loc),
                    ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError("query_start_loc must have num_seqs + 1 entries")
    if block_tables.stride(-1) != 1 or not query_start_loc.is_contiguous() \
            or not seq_lens.is_contiguous():
        raise ValueError("block_tables rows, query_start_loc and seq_lens must be contiguous")


def paged_attention_triton_impl(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_query_len: int,
    max_seq_len: int, num_segments: int | None = None, config: AttentionConfig | None = None,
    decode_config: AttentionConfig | None = None,
) -> torch.Tensor:
    """`paged_attention_triton` with the split count and tiles open (tests, benchmarks):
    `config` sets the tiles of every launch (default: attention_tuning's, per launch) and
    `decode_config` those of the decode rows alone."""
    _check_inputs(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # q may be a strided view
    if num_tokens == 0 or num_seqs == 0:
        return out
    if num_segments is None:
        num_segments = choose_num_segments(
            num_seqs, k_cache.shape[2], max_query_len, max_seq_len,
            streaming_multiprocessors(q.device))
    if num_segments < 1 or num_segments & (num_segments - 1):
        raise ValueError(f"num_segments must be a power of two >= 1, got {num_segments}")
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    if num_segments > 1:
        part_rows = num_tokens * num_heads * num_segments
        part_out = torch.empty(part_rows, head_dim_pad, dtype=torch.float32, device=q.device)
        part_max = torch.empty(part_rows, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(part_rows, dtype=torch.float32, device=q.device)
    else:
        part_out = part_max = part_sum = out  # unused placeholders
    tensors = (out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
               part_out, part_max, part_sum)

    element_size = k_cache.element_size()
    decode_config = decode_config or config or default_config(1, head_dim, q.device, element_size)
    _launch(tensors, scale, decode_config, num_segments, decode_rows=True)
    if max_query_len > 1:
        chunk_config = config or default_config(max_query_len, head_dim, q.device, element_size)
        _launch(tensors, scale, chunk_config, num_segments, decode_rows=False)
    if num_segments > 1:
        _merge_segments_kernel[(num_tokens, num_heads)](
            out, part_out, part_max, part_sum, out.stride(0), out.stride(1), num_heads,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_SEGMENTS=num_segments,
        )
    return out


def _launch(tensors: tuple[torch.Tensor, ...], scale: float, config: AttentionConfig,
            num_segments: int, decode_rows: bool) -> None:
    """One launch of the attention kernel over the decode rows or over the chunk rows."""
    out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens = tensors[:7]
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    compute_f32 = q.device.type != "cuda" or q.dtype == torch.float32  # the interpreter: fp32
    # Decode: one program per sequence. Chunks: sequence s owns q blocks from
    # query_start_loc[s] // block_q + s on (see _find_seq).
    programs = num_seqs if decode_rows else num_tokens // block_q + num_seqs
    _paged_attention_kernel[(programs, num_kv_heads, num_segments)](
        *tensors,
        scale * LOG2_E, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), num_heads,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q,
        TILE_N=config.tile_n, NUM_SEGMENTS=num_segments, COMPUTE_F32=compute_f32,
        DOT_PRECISION="ieee" if compute_f32 else "tf32", DECODE_ROWS=decode_rows,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_query_len: int,
    max_seq_len: int,
) -> torch.Tensor:
    """Same contract as `kernels.attention.paged_attention_torch`."""
    return paged_attention_triton_impl(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_query_len,
        max_seq_len,
    )
