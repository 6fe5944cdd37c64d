"""Rotary position embedding applied from a precomputed cos/sin cache."""

import torch

from kvdeck.kernels.reference.step_memo import StepMemo


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
    if torch.compiler.is_compiling():
        cos, sin = _cos_sin(positions, cos_sin_cache, is_neox)  # the compiler fuses it in
    else:
        cos, sin = _step_cos_sin.get((positions, cos_sin_cache), (is_neox,),
                                     lambda: _cos_sin(positions, cos_sin_cache, is_neox))
    # q and k in one rotation: each op of the formula runs once over both, not once each.
    num_heads = q.shape[1]
    rotated = _rotate(torch.cat((q, k), dim=1), cos, sin, is_neox)
    return rotated[:, :num_heads], rotated[:, num_heads:]


# Every layer rotates by the same positions: look cos/sin up once per step.
_step_cos_sin: StepMemo[tuple[torch.Tensor, torch.Tensor]] = StepMemo()


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool):
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    if is_neox:
        # rotate_half form: x * [cos, cos] + [x2, x1] * [-sin, sin], two fused halves.
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
    return cos[:, None, :], sin[:, None, :]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    if is_neox:
        rot_dim = cos.shape[-1]
        x_rot = x[..., :rot_dim].float()
        x1, x2 = x_rot.chunk(2, dim=-1)
        rotated = x_rot * cos + torch.cat((x2, x1), dim=-1) * sin
    else:
        rot_dim = cos.shape[-1] * 2
        x_rot = x[..., :rot_dim].float()
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    if rot_dim == x.shape[-1]:
        return rotated.to(x.dtype)
    return torch.cat((rotated.to(x.dtype), x[..., rot_dim:]), dim=-1)


def build_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """[max_positions, rotary_dim] fp32 with cos | sin halves."""
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
