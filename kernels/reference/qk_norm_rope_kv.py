"""The per-layer steps between the qkv projection and attention, as one op: per-head RMSNorm
of q and k (Qwen3's q_norm/k_norm, when given), rotary embedding of q and k, and the write
of k and v into the paged cache. The contract of `KernelOps.qk_norm_rope_kv_write`, which
a backend provides only where it fuses them (Triton); this composition of the reference ops
is what the fused kernel must equal."""

import torch

from kvdeck.kernels.reference.kv_cache import write_kv_cache_torch
from kvdeck.kernels.reference.rmsnorm import rms_norm_torch
from kvdeck.kernels.reference.rope import apply_rope_torch


def qk_norm_rope_kv_write_torch(
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
    """q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim]
    (views into a fused qkv buffer are fine). Returns the normed, rotated (q, k); k and v are
    written to the cache at `slot_mapping` (negative slots skipped). A backend may do it in
    place on q and k: use the returned tensors."""
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight come together (per-head q/k RMSNorm) or not at all")
    if q_weight is not None:
        head_dim = q.shape[-1]
        q = rms_norm_torch(q.reshape(-1, head_dim), q_weight, eps).view(q.shape)
        k = rms_norm_torch(k.reshape(-1, head_dim), k_weight, eps).view(k.shape)
    q, k = apply_rope_torch(positions, q, k, cos_sin_cache, is_neox)
    write_kv_cache_torch(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q, k
