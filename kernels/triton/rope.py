"""Triton rotary embedding, in place on q and k.

Rows are (token, head) pairs; a program rotates ROWS of them, reading each row's cos/sin
from the fp32 cache at its token's position. Axis 1 of the grid picks q or k. Same math as
`kernels.rope.apply_rope_torch` (rotation in fp32, dims past rotary_dim untouched).
Import through `kernels.triton_ops`.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start


@triton.jit
def _rotary_operands(positions_ptr, cos_sin_ptr, stride_cache_pos, token, row_valid,
                     HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr):
    """For rows of tokens: the columns each rotation pair reads (first, second), the pair's cos
    and sin at the token's position, and the mask of real rows and pairs."""
    pairs = tl.arange(0, HALF_PAD)
    mask = row_valid[:, None] & (pairs < HALF)[None, :]
    position = tl.load(positions_ptr + token, mask=row_valid, other=0).to(tl.int64)
    cache_row = cos_sin_ptr + position[:, None] * stride_cache_pos + pairs[None, :]
    cos = tl.load(cache_row, mask=mask, other=1.0)
    sin = tl.load(cache_row + HALF, mask=mask, other=0.0)
    if IS_NEOX:  # halves of the rotary dims: (i, i + HALF)
        first = pairs
        second = pairs + HALF
    else:  # adjacent pairs: (2i, 2i + 1)
        first = 2 * pairs
        second = 2 * pairs + 1
    return first, second, cos, sin, mask


@triton.jit
def _rotate_rows(
    x_ptr, stride_tok, stride_head, num_heads, num_tokens, positions_ptr, cos_sin_ptr,
    stride_cache_pos, row_start,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, ROWS: tl.constexpr, IS_NEOX: tl.constexpr,
):
    rows = row_start + tl.arange(0, ROWS).to(tl.int64)
    token = rows // num_heads
    head = rows % num_heads
    row_valid = token < num_tokens
    first, second, cos, sin, mask = _rotary_operands(positions_ptr, cos_sin_ptr, stride_cache_pos, token,
                                                     row_valid, HALF, HALF_PAD, IS_NEOX)
    base = x_ptr + token[:, None] * stride_tok + head[:, None] * stride_head
    x1 = tl.load(base + first[None, :], mask=mask, other=0.0)
    x2 = tl.load(base + second[None, :], mask=mask, other=0.0)
    x1f = x1.to(tl.float32)
    x2f = x2.to(tl.float32)
    tl.store(base + first[None, :], (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
    tl.store(base + second[None, :], (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)


@jit(do_not_specialize=('num_tokens',))  # batch-dependent: one variant for every value
def _rope_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_cache_pos,
    num_tokens, num_q_heads, num_k_heads,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, ROWS: tl.constexpr, IS_NEOX: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    row_start = tl.program_id(0).to(tl.int64) * ROWS
    if tl.program_id(1) == 0:
        _rotate_rows(q_ptr, stride_q_tok, stride_q_head, num_q_heads, num_tokens, positions_ptr,
                     cos_sin_ptr, stride_cache_pos, row_start, HALF, HALF_PAD, ROWS, IS_NEOX)
    else:
        _rotate_rows(k_ptr, stride_k_tok, stride_k_head, num_k_heads, num_tokens, positions_ptr,
                     cos_sin_ptr, stride_cache_pos, row_start, HALF, HALF_PAD, ROWS, IS_NEOX)


def apply_rope_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim]
    in place (views into a fused qkv buffer are fine) and returns them."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q/k must be [num_tokens, heads, head_dim] with matching tokens and "
                         f"head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [num_tokens={q.shape[0]}], "
                         f"got {tuple(positions.shape)}")
    rotary_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rotary_dim % 2 or rotary_dim > q.shape[2]:
        raise ValueError(f"cos_sin_cache must be [max_positions, rotary_dim <= head_dim "
                         f"{q.shape[2]}], got {tuple(cos_sin_cache.shape)}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    num_tokens, num_q_heads, _ = q.shape
    num_k_heads = k.shape[1]
    if num_tokens == 0:
        return q, k
    cos_sin_cache = cos_sin_cache.float().contiguous()
    half = rotary_dim // 2
    half_pad = triton.next_power_of_2(half)
    max_rows = num_tokens * max(num_q_heads, num_k_heads)
    rows = rows_per_program(half_pad, q.device)
    launch(_rope_kernel, (triton.cdiv(max_rows, rows), 2),
        positions.contiguous(), q, k, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        num_tokens, num_q_heads, num_k_heads,
        HALF=half, HALF_PAD=half_pad, ROWS=rows, IS_NEOX=is_neox,
        num_warps=num_warps_for(rows * half_pad),
    )
    return q, k
