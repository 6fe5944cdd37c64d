"""Rotary embedding frequencies, including Llama 3's and linear rope scaling."""

import math

import torch
from torch import nn

from kvdeck.kernels.rope import build_cos_sin_cache


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq.float()
    rope_type = scaling.get("rope_type")
    if rope_type == "linear":
        return (inv_freq / float(scaling["factor"])).float()
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling).float()
    raise ValueError(f"rope scaling type {rope_type!r} is not supported (supported: linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        cache = build_cos_sin_cache(rope_inv_freq(head_dim, theta, scaling), max_positions)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
