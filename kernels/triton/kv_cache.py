"""Triton KV-cache write: keys and values of ROWS tokens per program, both caches at once.

Same contract as `kernels.kv_cache.write_kv_cache_torch`; import through `kernels.triton_ops`
(TRITON_INTERPRET must be set before `triton.jit` runs).
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.kv_quant import FP8_DTYPES
from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.kv_quant import write_kv_cache_8bit
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start


@jit(do_not_specialize=('num_tokens',))  # batch-dependent: one variant for every value
def _write_kv_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_tok, stride_key_head, stride_value_tok, stride_value_head,
    stride_k_blk, stride_k_slot, stride_k_head,
    stride_v_blk, stride_v_slot, stride_v_head,
    num_tokens, num_kv_heads,
    HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    tokens = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    # Columns enumerate (head, dim) pairs of one token, padded to powers of two.
    cols = tl.arange(0, HEADS_PAD * HEAD_DIM_PAD)
    heads = cols // HEAD_DIM_PAD
    dims = cols % HEAD_DIM_PAD
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    # Negative slots mark padding tokens.
    mask = (slots[:, None] >= 0) & ((heads < num_kv_heads) & (dims < HEAD_DIM))[None, :]
    key = tl.load(key_ptr + tokens[:, None] * stride_key_tok
                  + (heads * stride_key_head + dims)[None, :], mask=mask)
    value = tl.load(value_ptr + tokens[:, None] * stride_value_tok
                    + (heads * stride_value_head + dims)[None, :], mask=mask)
    block = slots // BLOCK_SIZE
    in_block = slots % BLOCK_SIZE
    k_dst = (block * stride_k_blk + in_block * stride_k_slot)[:, None] \
        + (heads * stride_k_head + dims)[None, :]
    v_dst = (block * stride_v_blk + in_block * stride_v_slot)[:, None] \
        + (heads * stride_v_head + dims)[None, :]
    tl.store(k_cache_ptr + k_dst, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> None:
    """key/value: [num_tokens, num_kv_heads, head_dim]; negative slots are skipped. fp8 and
    int8 caches are quantised on the way in (`kernels.kv_quant_triton`)."""
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(f"key/value must both be [num_tokens, num_kv_heads, head_dim], "
                         f"got {tuple(key.shape)} and {tuple(value.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not match "
                         f"key heads/head_dim {tuple(key.shape[1:])}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must be [num_tokens={key.shape[0]}], "
                         f"got {tuple(slot_mapping.shape)}")
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache need a unit stride in head_dim")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if k_cache.dtype == torch.int8 or k_cache.dtype in FP8_DTYPES:
        write_kv_cache_8bit(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        return
    heads_pad, head_dim_pad = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    rows = rows_per_program(heads_pad * head_dim_pad, key.device)
    launch(_write_kv_cache_kernel, (triton.cdiv(num_tokens, rows),),
        key, value, k_cache, v_cache, slot_mapping.contiguous(),
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_tokens, num_kv_heads,
        HEAD_DIM=head_dim, HEADS_PAD=heads_pad, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=k_cache.shape[1], ROWS=rows, num_warps=num_warps_for(rows * heads_pad * head_dim_pad),
    )
