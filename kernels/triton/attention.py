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

Layer options, as the torch reference: a sliding window (the tiles before the window of
the block's first query are not read; tiles at the window's edge are masked like the
diagonal), soft-capped scores (c * tanh(s / c), tanh from exp), and 8-bit caches
dequantised as tiles are loaded: fp8 bytes through fp16 (`kv_quant_triton.decode_fp8`)
with the per-tensor scales folded into the score scale and the output; int8 with each
key's scale on its score column and each value's on its probability column.

Kept importable only through `kernels.triton_ops`: `triton.jit` decides compiled vs
interpreted at import time, so TRITON_INTERPRET must be set before this module loads.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.kv_quant import FP8_DTYPES
from kvdeck.kernels.triton.attention_tuning import (
    AttentionConfig,
    choose_num_segments,
    default_config,
    streaming_multiprocessors,
)
from kvdeck.kernels.triton.kv_quant import E4M3_DECODE_FACTOR, FP8_MANTISSA, decode_fp8
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.pdl import pdl_start

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
    ks_head_ptr, vs_head_ptr, stride_k_blk, stride_k_slot, stride_v_blk, stride_v_slot,
    stride_s_blk, stride_s_slot, qk_scale, window, soft_cap,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, COMPUTE_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr, SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr,
    FP8_MANT: tl.constexpr, TOKEN_SCALES: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
):
    """Online-softmax update over KV tiles [tile_lo, tile_hi) read through the block table.
    Unmasked tiles (MASKED False) hold only keys every row of the block sees. Cache offsets
    are 32-bit unless the cache spans 2^31 elements (WIDE_OFFSETS): each key's address is
    then a few 32-bit operations, not 64-bit ones (with triton 3.6, Hopper's decode tile at
    head dim 128 ran 981 instructions a tile that way, 589 this way)."""
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM
    for tile in range(scalar(tile_lo), scalar(tile_hi)):
        kpos = tile * TILE_N + tl.arange(0, TILE_N)
        kv_valid = kpos < kv_end
        if MASKED:
            kv_mask = kv_valid
        else:  # every key of the tile exists and is visible to every row
            kv_mask = kpos >= 0
        block_id = tl.load(bt_row + kpos // BLOCK_SIZE, mask=kv_mask, other=0)
        block_id = block_id.to(tl.int64) if WIDE_OFFSETS else block_id.to(tl.int32)
        in_block = kpos % BLOCK_SIZE
        k_off = block_id * stride_k_blk + in_block * stride_k_slot
        v_off = block_id * stride_v_blk + in_block * stride_v_slot
        if MASKED or HEAD_DIM != HEAD_DIM_PAD:
            k = tl.load(k_head_ptr + k_off[None, :] + dims[:, None],
                        mask=dim_valid[:, None] & kv_mask[None, :], other=0)
            v = tl.load(v_head_ptr + v_off[:, None] + dims[None, :],
                        mask=kv_mask[:, None] & dim_valid[None, :], other=0)
        else:
            k = tl.load(k_head_ptr + k_off[None, :] + dims[:, None])
            v = tl.load(v_head_ptr + v_off[:, None] + dims[None, :])
        if FP8_MANT != 0:  # bytes -> fp16 (the e4m3 factor is folded into the scales)
            k = decode_fp8(k, FP8_MANT)
            v = decode_fp8(v, FP8_MANT)
        if COMPUTE_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PRECISION)
        if TOKEN_SCALES:  # int8: each key's own scale on its score column
            s_off = block_id * stride_s_blk + in_block * stride_s_slot
            k_scale = tl.load(ks_head_ptr + s_off, mask=kv_mask, other=0.0).to(tl.float32)
            s = s * k_scale[None, :]
        if SOFT_CAP:  # qk_scale is in natural units here: cap, then to log2 units
            s = s * qk_scale / soft_cap
            s = soft_cap * (1.0 - 2.0 / (tl.exp(2.0 * s) + 1.0)) * 1.4426950408889634
        else:
            s = s * qk_scale
        if MASKED:
            visible = (kpos[None, :] <= query_pos[:, None]) & kv_valid[None, :]
            if SLIDING:
                visible = visible & (kpos[None, :] > query_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep -inf; subtract 0 so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if TOKEN_SCALES:  # int8: each value's scale on its probability column
            v_scale = tl.load(vs_head_ptr + s_off, mask=kv_mask, other=0.0).to(tl.float32)
            p = p * v_scale[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@jit(do_not_specialize=('num_seqs', 'stride_bt_seq'))  # batch-dependent: one variant for every value
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr,
    seq_lens_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, k_scales_ptr, v_scales_ptr,
    qk_scale, v_mult, window, soft_cap, num_seqs,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_k_blk, stride_k_slot, stride_k_head,
    stride_v_blk, stride_v_slot, stride_v_head, stride_s_blk, stride_s_slot,
    stride_bt_seq, num_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, COMPUTE_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DECODE_ROWS: tl.constexpr, SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr,
    FP8_MANT: tl.constexpr, TOKEN_SCALES: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
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
    first_query_pos = context_len + q_block_local * BLOCK_Q
    if SLIDING:  # tiles wholly before the first row's window are never read
        first_tile = tl.maximum(first_query_pos - window + 1, 0) // TILE_N
        # Below this tile some row's window has not started yet: masked like the diagonal.
        low_safe_tile = (tl.maximum(kv_end - window, 0) + TILE_N - 1) // TILE_N
    else:
        first_tile = 0
        low_safe_tile = 0
    tiles_per_segment = (num_tiles - first_tile + NUM_SEGMENTS - 1) // NUM_SEGMENTS
    tile_begin = first_tile + segment * tiles_per_segment
    tile_stop = tl.minimum(tile_begin + tiles_per_segment, num_tiles)

    # Tiles wholly at or below the block's first query position (and, with a window, wholly
    # inside every row's window) need no mask (the fast path); the rest are masked:
    # [tile_begin, low_end) the window's edge, [low_end, high_begin) unmasked,
    # [high_begin, tile_stop) the diagonal and the tail of the sequence.
    first_masked_tile = (first_query_pos + 1) // TILE_N
    low_end = tl.minimum(tl.maximum(low_safe_tile, tile_begin), tile_stop)
    high_begin = tl.minimum(tl.maximum(first_masked_tile, low_end), tile_stop)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head
    ks_head_ptr = k_scales_ptr + kv_head  # int8 scales: [num_blocks, block_size, num_kv_heads]
    vs_head_ptr = v_scales_ptr + kv_head
    for phase in tl.static_range(3):
        # Without a window phase 0 is empty: not compiled at all (a third inlined tile loop
        # costs registers; the fp32 decode tiles spilled with it).
        if SLIDING or phase != 0:
            if phase == 0:
                lo = tile_begin
                hi = low_end
            elif phase == 1:
                lo = low_end
                hi = high_begin
            else:
                lo = high_begin
                hi = tile_stop
            acc, l_i, m_i = _attend_tiles(
                acc, l_i, m_i, q, query_pos, lo, hi, kv_end, bt_row, k_head_ptr, v_head_ptr,
                ks_head_ptr, vs_head_ptr, stride_k_blk, stride_k_slot, stride_v_blk,
                stride_v_slot, stride_s_blk, stride_s_slot, qk_scale, window, soft_cap,
                HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, TILE_N, COMPUTE_F32, DOT_PRECISION,
                phase != 1, SLIDING, SOFT_CAP, FP8_MANT, TOKEN_SCALES, WIDE_OFFSETS,
            )
    acc = acc * v_mult  # fp8's per-tensor V scale (1 otherwise)

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
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, NUM_SEGMENTS: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
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


def element_span(t: torch.Tensor) -> int:
    """How many elements from a tensor's first to its last, plus one (its storage extent)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


@dataclass(frozen=True, slots=True)
class _CacheReading:
    """How the kernel reads one layer's cache: its storage views and the scale folding."""

    k: torch.Tensor  # fp8 caches as uint8 views
    v: torch.Tensor
    k_scales: torch.Tensor | None  # int8's [num_blocks, block_size, num_kv_heads]
    v_scales: torch.Tensor | None
    k_factor: float  # per-tensor multipliers (fp8's scales, e4m3's decode factor)
    v_factor: float
    fp8_mantissa: int  # 0: not fp8
    # An element of the cache 2^31 or more past its start: the kernel's offsets are 64-bit.
    wide_offsets: bool

    @classmethod
    def of(cls, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale, v_scale) -> "_CacheReading":
        wide = max(element_span(k_cache), element_span(v_cache)) > 2**31 - 1
        if k_cache.dtype in FP8_DTYPES:
            factor = E4M3_DECODE_FACTOR if k_cache.dtype == torch.float8_e4m3fn else 1.0
            return cls(k_cache.view(torch.uint8), v_cache.view(torch.uint8), None, None,
                       factor * (1.0 if k_scale is None else float(k_scale)),
                       factor * (1.0 if v_scale is None else float(v_scale)),
                       FP8_MANTISSA[k_cache.dtype], wide)
        if k_cache.dtype == torch.int8:
            if not (isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor)):
                raise ValueError("an int8 KV cache needs its per-(token, head) scale tensors")
            if k_scale.shape != k_cache.shape[:3] or not k_scale.is_contiguous() \
                    or v_scale.shape != k_scale.shape or not v_scale.is_contiguous():
                raise ValueError(f"int8 scales must be contiguous {tuple(k_cache.shape[:3])}")
            return cls(k_cache, v_cache, k_scale, v_scale, 1.0, 1.0, 0, wide)
        return cls(k_cache, v_cache, None, None, 1.0, 1.0, 0, wide)


def paged_attention_triton_impl(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_query_len: int,
    max_seq_len: int, sliding_window: int = 0, soft_cap: float = 0.0,
    k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
    num_segments: int | None = None, config: AttentionConfig | None = None,
    decode_config: AttentionConfig | None = None,
) -> torch.Tensor:
    """`paged_attention_triton` with the split count and tiles open (tests, benchmarks):
    `config` sets the tiles of every launch (default: attention_tuning's, per launch) and
    `decode_config` those of the decode rows alone."""
    _check_inputs(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    reading = _CacheReading.of(k_cache, v_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # q may be a strided view
    if num_tokens == 0 or num_seqs == 0:
        return out
    if num_segments is None:
        longest_read = min(max_seq_len, sliding_window) if sliding_window > 0 else max_seq_len
        num_segments = choose_num_segments(
            num_seqs, k_cache.shape[2], max_query_len, longest_read,
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
    tensors = (out, q, reading.k, reading.v, block_tables, query_start_loc, seq_lens,
               part_out, part_max, part_sum,
               reading.k_scales if reading.k_scales is not None else out,  # unused placeholders
               reading.v_scales if reading.v_scales is not None else out)
    options = _LayerOptions(scale, sliding_window, soft_cap, reading)

    element_size = k_cache.element_size()
    decode_config = decode_config or config or default_config(1, head_dim, q.device, element_size)
    _launch(tensors, options, decode_config, num_segments, decode_rows=True)
    if max_query_len > 1:
        chunk_config = config or default_config(max_query_len, head_dim, q.device, element_size)
        _launch(tensors, options, chunk_config, num_segments, decode_rows=False)
    if num_segments > 1:
        launch(_merge_segments_kernel, (num_tokens, num_heads),
            out, part_out, part_max, part_sum, out.stride(0), out.stride(1), num_heads,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_SEGMENTS=num_segments,
        )
    return out


@dataclass(frozen=True, slots=True)
class _LayerOptions:
    scale: float
    sliding_window: int
    soft_cap: float
    reading: _CacheReading

    @property
    def qk_scale(self) -> float:
        """The score multiplier: in log2 units for exp2, or natural ones before a soft cap."""
        natural = self.scale * self.reading.k_factor
        return natural if self.soft_cap > 0 else natural * LOG2_E


def _launch(tensors: tuple[torch.Tensor, ...], options: _LayerOptions, config: AttentionConfig,
            num_segments: int, decode_rows: bool) -> None:
    """One launch of the attention kernel over the decode rows or over the chunk rows."""
    out, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens = tensors[:7]
    k_scales = tensors[10]
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    block_m = max(config.block_m, triton.next_power_of_2(group))
    block_q = block_m // group
    compute_f32 = q.device.type != "cuda" or q.dtype == torch.float32  # the interpreter: fp32
    reading = options.reading
    token_scales = reading.k_scales is not None
    # Decode: one program per sequence. Chunks: sequence s owns q blocks from
    # query_start_loc[s] // block_q + s on (see _find_seq).
    programs = num_seqs if decode_rows else num_tokens // block_q + num_seqs
    launch(_paged_attention_kernel, (programs, num_kv_heads, num_segments),
        *tensors,
        options.qk_scale, reading.v_factor, options.sliding_window, options.soft_cap, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_scales.stride(0) if token_scales else 0, k_scales.stride(1) if token_scales else 0,
        block_tables.stride(0), num_heads,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q,
        TILE_N=config.tile_n, NUM_SEGMENTS=num_segments, COMPUTE_F32=compute_f32,
        DOT_PRECISION="ieee" if compute_f32 else "tf32", DECODE_ROWS=decode_rows,
        SLIDING=options.sliding_window > 0, SOFT_CAP=options.soft_cap > 0,
        FP8_MANT=reading.fp8_mantissa, TOKEN_SCALES=token_scales, WIDE_OFFSETS=reading.wide_offsets,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_query_len: int,
    max_seq_len: int, sliding_window: int = 0, soft_cap: float = 0.0,
    k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `kernels.attention.paged_attention_torch`."""
    return paged_attention_triton_impl(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, max_query_len,
        max_seq_len, sliding_window, soft_cap, k_scale, v_scale,
    )
