"""The torch backend: the torch references (kernels/reference/), with the native CPU kernels
(kernels/cpu/native.py) where they apply: bf16 on a CPU with AVX512-BF16, eagerly (a
compiled graph fuses these itself). fp32 always runs the references, the exact comparison
with transformers. On CUDA (attention_backend="torch") every op is its reference.
"""

import torch

from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.ops import KernelOps
from kvdeck.kernels.reference.activation import gelu_tanh_and_mul_torch, silu_and_mul_torch
from kvdeck.kernels.reference.attention import paged_attention_torch
from kvdeck.kernels.reference.kv_cache import write_kv_cache_torch
from kvdeck.kernels.reference.rmsnorm import rms_norm_torch
from kvdeck.kernels.reference.rope import apply_rope_torch


def paged_attention_torch_backend(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                  max_query_len, max_seq_len, sliding_window=0, soft_cap=0.0, k_scale=None,
                                  v_scale=None):
    """The torch backend's attention: `paged_attention_torch`, except that a decode-only bf16
    step on a CPU with the native kernels runs `cpu_native.decode_attention` (the same
    contract, a tenth of the calls)."""
    if cpu_native.decode_attention_applies(q, k_cache, max_query_len, k_scale):
        return cpu_native.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                           sliding_window, soft_cap)
    return paged_attention_torch(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                 max_query_len, max_seq_len, sliding_window, soft_cap, k_scale, v_scale)


def rms_norm_torch_backend(x, weight, eps, residual=None):
    """`rms_norm_torch`, or for bf16 on a CPU with the native kernels one pass per row."""
    if (cpu_native.elementwise_applies(x) and weight.dtype == torch.bfloat16
            and (residual is None or residual.dtype == torch.bfloat16)):
        return cpu_native.rms_norm(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


def apply_rope_torch_backend(positions, q, k, cos_sin_cache, is_neox=True):
    """`apply_rope_torch`, or for bf16 rotate-half rotary on such a CPU one native call."""
    if cpu_native.rope_applies(q, k, cos_sin_cache, is_neox):
        return cpu_native.apply_rope_neox(positions, q, k, cos_sin_cache)
    return apply_rope_torch(positions, q, k, cos_sin_cache, is_neox)


def silu_and_mul_torch_backend(x):
    """`silu_and_mul_torch`, or for bf16 on such a CPU one native pass."""
    if cpu_native.elementwise_applies(x) and x.shape[-1] % 2 == 0:
        return cpu_native.silu_and_mul(x)
    return silu_and_mul_torch(x)


TORCH_OPS = KernelOps(
    name="torch",
    paged_attention=paged_attention_torch_backend,
    write_kv_cache=write_kv_cache_torch,
    rms_norm=rms_norm_torch_backend,
    apply_rope=apply_rope_torch_backend,
    silu_and_mul=silu_and_mul_torch_backend,
    gelu_tanh_and_mul=gelu_tanh_and_mul_torch,
)
