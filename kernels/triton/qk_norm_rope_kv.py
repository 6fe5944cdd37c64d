"""Triton per-head q/k RMSNorm + rotary embedding + KV-cache write in one launch.

Replaces, per attention layer, up to four launches (q norm, k norm, RoPE, KV write) and the
copies a per-head norm makes of the strided q/k views of the fused qkv buffer. Rows are
(token, head) pairs, ROWS of them per program; axis 1 of the grid picks q (norm, rotate, in
place), k (the same, and its cache rows) or v (its cache rows, read from the strided view).
Each step rounds as the unfused kernels do (kernels/triton/rmsnorm.py, rope.py,
kv_cache.py): the norm's statistics over the whole row in fp32, the normed value rounded to
the activation dtype, the weight applied and rounded again, the rotation in fp32. The
rotation reads and writes each pair by the same thread (two half-row tiles, as rope.py
does), so q and k are rewritten in place without a race. Contract:
`kernels.reference.qk_norm_rope_kv.qk_norm_rope_kv_write_torch`.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.kv_quant import FP8_DTYPES
from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.rmsnorm import rms_norm_triton
from kvdeck.kernels.triton.rope import _rotary_operands, apply_rope_triton


@triton.jit
def _normed(x, rstd, w_ptr, cols, mask, HAS_NORM: tl.constexpr):
    """x as fp32, normed and weighted with the unfused kernel's two roundings."""
    xf = x.to(tl.float32)
    if HAS_NORM:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        xf = ((xf * rstd[:, None]).to(x.dtype).to(tl.float32) * w[None, :]).to(x.dtype)
        xf = xf.to(tl.float32)
    return xf


@triton.jit
def _norm_rope_rows(
    x_ptr, w_ptr, stride_tok, stride_head, num_heads, num_tokens, positions_ptr, cos_sin_ptr,
    stride_cache_pos, eps, row_start,
    cache_ptr, slot_mapping_ptr, stride_c_blk, stride_c_slot, stride_c_head,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, HAS_NORM: tl.constexpr,
    IS_NEOX: tl.constexpr, WRITE_CACHE: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr,
):
    rows = row_start + tl.arange(0, ROWS).to(tl.int64)
    token = rows // num_heads
    head = rows % num_heads
    row_valid = token < num_tokens
    base = x_ptr + token[:, None] * stride_tok + head[:, None] * stride_head
    rstd = tl.zeros((ROWS,), dtype=tl.float32)
    if HAS_NORM:  # statistics over the whole row first: every store below depends on them
        cols = tl.arange(0, HEAD_DIM_PAD)
        full = tl.load(base + cols[None, :], mask=row_valid[:, None] & (cols < HEAD_DIM)[None, :],
                       other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(full * full, 1) / HEAD_DIM + eps)
    first, second, cos, sin, mask = _rotary_operands(positions_ptr, cos_sin_ptr, stride_cache_pos, token,
                                                     row_valid, HALF, HALF_PAD, IS_NEOX)
    pairs = tl.arange(0, HALF_PAD)
    x1 = tl.load(base + first[None, :], mask=mask, other=0.0)
    x2 = tl.load(base + second[None, :], mask=mask, other=0.0)
    x1f = _normed(x1, rstd, w_ptr, first, pairs < HALF, HAS_NORM)
    x2f = _normed(x2, rstd, w_ptr, second, pairs < HALF, HAS_NORM)
    out1 = (x1f * cos - x2f * sin).to(x1.dtype)
    out2 = (x2f * cos + x1f * sin).to(x1.dtype)
    tl.store(base + first[None, :], out1, mask=mask)
    tl.store(base + second[None, :], out2, mask=mask)
    if WRITE_CACHE:
        slots = tl.load(slot_mapping_ptr + token, mask=row_valid, other=-1).to(tl.int64)
        dst = cache_ptr + ((slots // BLOCK_SIZE) * stride_c_blk + (slots % BLOCK_SIZE) * stride_c_slot
                           + head * stride_c_head)[:, None]
        cache_mask = mask & (slots >= 0)[:, None]
        tl.store(dst + first[None, :], out1.to(cache_ptr.dtype.element_ty), mask=cache_mask)
        tl.store(dst + second[None, :], out2.to(cache_ptr.dtype.element_ty), mask=cache_mask)
    if HEAD_DIM > 2 * HALF:  # partial rotary: the dims past rotary_dim are normed, not rotated
        tail = 2 * HALF + tl.arange(0, TAIL_PAD)
        tail_mask = row_valid[:, None] & (tail < HEAD_DIM)[None, :]
        if HAS_NORM or WRITE_CACHE:
            xt = tl.load(base + tail[None, :], mask=tail_mask, other=0.0)
            outt = _normed(xt, rstd, w_ptr, tail, tail < HEAD_DIM, HAS_NORM).to(xt.dtype)
            if HAS_NORM:
                tl.store(base + tail[None, :], outt, mask=tail_mask)
            if WRITE_CACHE:
                tl.store(dst + tail[None, :], outt.to(cache_ptr.dtype.element_ty),
                         mask=tail_mask & (slots >= 0)[:, None])


@jit(do_not_specialize=('num_tokens',))  # batch-dependent: one variant for every value
def _qk_norm_rope_kv_kernel(
    q_ptr, k_ptr, v_ptr, q_weight_ptr, k_weight_ptr, positions_ptr, cos_sin_ptr,
    slot_mapping_ptr, k_cache_ptr, v_cache_ptr,
    stride_q_tok, stride_q_head, stride_key_tok, stride_key_head,
    stride_value_tok, stride_value_head, stride_cache_pos,
    stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
    num_tokens, num_q_heads, num_kv_heads, eps,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, TAIL_PAD: tl.constexpr, HAS_NORM: tl.constexpr,
    IS_NEOX: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    row_start = tl.program_id(0).to(tl.int64) * ROWS
    which = tl.program_id(1)
    if which == 0:
        _norm_rope_rows(q_ptr, q_weight_ptr, stride_q_tok, stride_q_head, num_q_heads, num_tokens,
                        positions_ptr, cos_sin_ptr, stride_cache_pos, eps, row_start,
                        k_cache_ptr, slot_mapping_ptr, stride_k_blk, stride_k_slot, stride_k_head,
                        HEAD_DIM, HEAD_DIM_PAD, HALF, HALF_PAD, TAIL_PAD, HAS_NORM, IS_NEOX,
                        False, BLOCK_SIZE, ROWS)
    elif which == 1:
        _norm_rope_rows(k_ptr, k_weight_ptr, stride_key_tok, stride_key_head, num_kv_heads,
                        num_tokens, positions_ptr, cos_sin_ptr, stride_cache_pos, eps, row_start,
                        k_cache_ptr, slot_mapping_ptr, stride_k_blk, stride_k_slot, stride_k_head,
                        HEAD_DIM, HEAD_DIM_PAD, HALF, HALF_PAD, TAIL_PAD, HAS_NORM, IS_NEOX,
                        True, BLOCK_SIZE, ROWS)
    else:
        rows = row_start + tl.arange(0, ROWS).to(tl.int64)
        token = rows // num_kv_heads
        head = rows % num_kv_heads
        cols = tl.arange(0, HEAD_DIM_PAD)
        slots = tl.load(slot_mapping_ptr + token, mask=token < num_tokens, other=-1).to(tl.int64)
        mask = (slots >= 0)[:, None] & (cols < HEAD_DIM)[None, :]
        value = tl.load(v_ptr + (token * stride_value_tok + head * stride_value_head)[:, None]
                        + cols[None, :], mask=mask)
        dst = (slots // BLOCK_SIZE) * stride_v_blk + (slots % BLOCK_SIZE) * stride_v_slot \
            + head * stride_v_head
        tl.store(v_cache_ptr + dst[:, None] + cols[None, :],
                 value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def qk_norm_rope_kv_write_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k normed and rotated in place (views into a fused qkv buffer are fine), k and v
    written to the cache; returns (q, k). 8-bit caches, norm weights of another dtype than
    q, or rows without a unit stride take the unfused kernels."""
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight come together (per-head q/k RMSNorm) or not at all")
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[::2] != k.shape[::2]:
        raise ValueError(f"q must be [num_tokens, heads, head_dim], k and v [num_tokens, kv_heads, "
                         f"head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if positions.shape != (num_tokens,) or slot_mapping.shape != (num_tokens,):
        raise ValueError(f"positions and slot_mapping must be [num_tokens={num_tokens}], got "
                         f"{tuple(positions.shape)} and {tuple(slot_mapping.shape)}")
    rotary_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"cos_sin_cache must be [max_positions, rotary_dim <= head_dim "
                         f"{head_dim}], got {tuple(cos_sin_cache.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not match "
                         f"key heads/head_dim {tuple(k.shape[1:])}")
    has_norm = q_weight is not None
    unfused = (k_cache.dtype == torch.int8 or k_cache.dtype in FP8_DTYPES
               or len({q.dtype, k.dtype, v.dtype}) > 1
               or (has_norm and (q_weight.dtype != q.dtype or k_weight.dtype != q.dtype))
               or any(t.stride(-1) != 1 for t in (q, k, v, k_cache, v_cache)))
    if unfused:
        if has_norm:
            q = rms_norm_triton(q, q_weight, eps)
            k = rms_norm_triton(k, k_weight, eps)
        q, k = apply_rope_triton(positions, q, k, cos_sin_cache, is_neox)
        write_kv_cache_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return q, k
    if num_tokens == 0:
        return q, k
    cos_sin_cache = cos_sin_cache.float().contiguous()
    half = rotary_dim // 2
    tail = head_dim - rotary_dim
    head_dim_pad = triton.next_power_of_2(head_dim)
    rows = rows_per_program(head_dim_pad, q.device)
    weights = (q_weight.contiguous(), k_weight.contiguous()) if has_norm else (q, k)  # unused
    launch(_qk_norm_rope_kv_kernel, (triton.cdiv(num_tokens * max(num_q_heads, num_kv_heads), rows), 3),
        q, k, v, *weights, positions.contiguous(), cos_sin_cache, slot_mapping.contiguous(),
        k_cache, v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_tokens, num_q_heads, num_kv_heads, float(eps),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, HALF=half,
        HALF_PAD=triton.next_power_of_2(max(half, 1)), TAIL_PAD=triton.next_power_of_2(max(tail, 1)),
        HAS_NORM=has_norm, IS_NEOX=is_neox, BLOCK_SIZE=k_cache.shape[1], ROWS=rows,
        num_warps=num_warps_for(rows * head_dim_pad),
    )
    return q, k
