"""Triton side of the 8-bit KV cache: the quantising cache write, and the fp8 decode the
attention kernel uses. Same rounding as `kernels.kv_quant` (bit for bit).

fp8 is handled as bytes (the caches are passed as uint8 views): encoded from fp32 with
integer ops (round to nearest even, a mantissa carry bumping the exponent) and decoded
through fp16's bit layout. Triton's own fp8 casts need sm_89 for e4m3, and the CPU
interpreter's fp32 -> fp8 cast drops a carry (1.99 becomes 1.0), so neither is used; the
byte form runs the same on every GPU and under the interpreter.

Import through `kernels.triton_ops` (TRITON_INTERPRET must be set before `triton.jit` runs).
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.kv_quant import FP8_MAX, INT8_MAX
from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start

# Mantissa bits of each fp8 format (the kernels' FP8_MANT; 0 means int8).
FP8_MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
# e4m3 decodes through fp16 shifted by 8 binades; the caller folds this into its scale.
E4M3_DECODE_FACTOR = 256.0


@triton.jit
def _rne_shift(value, shift):
    """value >> shift, rounded to nearest even (value >= 0, 1 <= shift <= 31)."""
    half = (1 << (shift - 1)) - 1
    return (value + half + ((value >> shift) & 1)) >> shift


@triton.jit
def encode_fp8(x, MANT: tl.constexpr):
    """fp32 (already within the format's range) -> fp8 code in an int32, as torch's cast."""
    if MANT == 3:  # e4m3fn: bias 7, largest finite 0x7E (448)
        bias = 7
        max_code = 0x7E
    else:  # e5m2: bias 15, largest finite 0x7B (57344)
        bias = 15
        max_code = 0x7B
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    exponent = magnitude >> 23
    # Normal range: drop 23 - MANT mantissa bits; a carry rounds up into the exponent.
    normal = _rne_shift(magnitude, 23 - MANT) - ((127 - bias) << MANT)
    # Below the format's smallest normal: multiples of 2^(1 - bias - MANT).
    mantissa = (magnitude & 0x7FFFFF) | 0x800000
    sub_shift = tl.minimum(151 - bias - MANT - exponent, 31)
    subnormal = _rne_shift(mantissa, tl.maximum(sub_shift, 1))
    code = tl.where(exponent < 128 - bias, subnormal, normal)
    code = tl.where(exponent == 0, 0, tl.minimum(code, max_code))
    return code | sign


@triton.jit
def decode_fp8(code, MANT: tl.constexpr):
    """fp8 code (uint8) -> fp16: e5m2 is an fp16's top byte; e4m3 read as an fp16 is its
    value / 256 (E4M3_DECODE_FACTOR), subnormals included."""
    c = code.to(tl.int16)
    if MANT == 2:
        bits = c << 8
    else:
        bits = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
    return bits.to(tl.float16, bitcast=True)


@triton.jit
def _quantize_rows(x, scale, FP8_MANT: tl.constexpr, FP8_LIMIT: tl.constexpr):
    """[ROWS, D] fp32 -> (codes as int32, per-row scale). fp8: `scale` is the tensor's;
    int8: absmax / 127 per row, rounded to fp16 as it is stored."""
    if FP8_MANT == 0:
        row_scale = (tl.max(tl.abs(x), 1) / 127.0).to(tl.float16).to(tl.float32)
        divisor = tl.where(row_scale == 0.0, 1.0, row_scale)
        y = x / divisor[:, None]
        y = y + tl.where(y >= 0, 0.5, -0.5)
        codes = tl.minimum(tl.maximum(y.to(tl.int32), -127), 127)
    else:
        y = tl.minimum(tl.maximum(x / scale, -FP8_LIMIT), FP8_LIMIT)
        codes = encode_fp8(y, FP8_MANT)
        row_scale = scale
    return codes, row_scale


@jit(do_not_specialize=('num_tokens',))  # batch-dependent: one variant for every value
def _write_kv_8bit_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, slot_mapping_ptr,
    k_scale, v_scale,
    stride_key_tok, stride_key_head, stride_value_tok, stride_value_head,
    stride_cache_blk, stride_cache_slot, stride_cache_head, num_tokens, num_kv_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr, FP8_MANT: tl.constexpr, FP8_LIMIT: tl.constexpr, PDL: tl.constexpr = False,
):
    """ROWS tokens of one kv head per program; int8 (FP8_MANT 0) also writes each row's scale."""
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    head = tl.program_id(1)
    tokens = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM_PAD)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    row_ok = slots >= 0  # negative slots mark padding tokens
    mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    key = tl.load(key_ptr + tokens[:, None] * stride_key_tok + head * stride_key_head + dims[None, :],
                  mask=mask, other=0.0).to(tl.float32)
    value = tl.load(value_ptr + tokens[:, None] * stride_value_tok + head * stride_value_head
                    + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    k_codes, k_row_scale = _quantize_rows(key, k_scale, FP8_MANT, FP8_LIMIT)
    v_codes, v_row_scale = _quantize_rows(value, v_scale, FP8_MANT, FP8_LIMIT)
    slot_base = (slots // BLOCK_SIZE) * stride_cache_blk + (slots % BLOCK_SIZE) * stride_cache_slot \
        + head * stride_cache_head
    dst = slot_base[:, None] + dims[None, :]
    element = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + dst, k_codes.to(element), mask=mask)
    tl.store(v_cache_ptr + dst, v_codes.to(element), mask=mask)
    if FP8_MANT == 0:
        scale_at = slots * num_kv_heads + head
        tl.store(k_scales_ptr + scale_at, k_row_scale.to(tl.float16), mask=row_ok)
        tl.store(v_scales_ptr + scale_at, v_row_scale.to(tl.float16), mask=row_ok)


def write_kv_cache_8bit(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scale: float | torch.Tensor | None,
    v_scale: float | torch.Tensor | None,
) -> None:
    """The quantising write into an fp8 or int8 cache (contract of
    `kernels.kv_cache.write_kv_cache_torch`); inputs are checked by the caller."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share one layout")
    if k_cache.dtype == torch.int8:
        if not (isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor)):
            raise ValueError("an int8 KV cache needs its per-(token, head) scale tensors")
        if not (k_scale.is_contiguous() and v_scale.is_contiguous()) \
                or k_scale.shape != k_cache.shape[:3]:
            raise ValueError(f"int8 scales must be contiguous {tuple(k_cache.shape[:3])}")
        scales, tensor_scales = (k_scale, v_scale), (1.0, 1.0)
        caches, mantissa, limit = (k_cache, v_cache), 0, float(INT8_MAX)
    else:
        scales = (slot_mapping, slot_mapping)  # unused pointers
        tensor_scales = (1.0 if k_scale is None else float(k_scale),
                         1.0 if v_scale is None else float(v_scale))
        caches = (k_cache.view(torch.uint8), v_cache.view(torch.uint8))
        mantissa, limit = FP8_MANTISSA[k_cache.dtype], FP8_MAX[k_cache.dtype]
    head_dim_pad = triton.next_power_of_2(head_dim)
    rows = rows_per_program(head_dim_pad, key.device)
    launch(_write_kv_8bit_kernel, (triton.cdiv(num_tokens, rows), num_kv_heads),
        key, value, *caches, *scales, slot_mapping.contiguous(), *tensor_scales,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), num_tokens, num_kv_heads,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_SIZE=k_cache.shape[1], ROWS=rows,
        FP8_MANT=mantissa, FP8_LIMIT=limit, num_warps=num_warps_for(rows * head_dim_pad),
    )
