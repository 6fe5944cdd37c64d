"""Rotary position embedding applied from a precomputed cos/sin cache."""

import torch


def apply_rope_torch(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [num_tokens, num_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim].

    cos_sin_cache: [max_positions, rotary_dim] fp32, cos in the first half, sin in the
    second. `is_neox` rotates the two halves of the head (Llama/Qwen in HF layout);
    otherwise adjacent pairs (GPT-J / interleaved). Returns new (q, k).
    """
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return _rotate(q, cos, sin, is_neox), _rotate(k, cos, sin, is_neox)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    rot_dim = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot_dim].float(), x[..., rot_dim:]
    if is_neox:
        x1, x2 = x_rot.chunk(2, dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    rotated = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((rotated.to(x.dtype), x_pass), dim=-1)


def build_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """[max_positions, rotary_dim] fp32 with cos | sin halves."""
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
