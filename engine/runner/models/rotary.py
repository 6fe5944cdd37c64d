"""Rotary embedding tables: plain rope, linear and Llama 3 scaling, and Phi-3's LongRoPE.

`rotary_dim` is the part of each head that is rotated (Phi-4-mini rotates 3/4 of it); the
rest passes through.
"""

import math

import torch
from torch import nn

from kvdeck.kernels.reference.rope import build_cos_sin_cache


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq.float()
    rope_type = scaling.get("rope_type")
    if rope_type == "linear":
        return (inv_freq / float(scaling["factor"])).float()
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling).float()
    raise ValueError(f"rope scaling type {rope_type!r} is not supported (supported: linear, "
                     "llama3, longrope)")


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


def longrope_cos_sin_cache(rotary_dim: int, max_positions: int, theta: float,
                           scaling: dict) -> torch.Tensor:
    """LongRoPE (Phi-3 `su`/`longrope`): the short factors' table for the pretraining
    context `original`, then the long factors' for every position, both scaled by the
    attention factor. A sequence longer than `original` rotates all its positions with the
    long factors (as transformers' Phi-3 does, recomputing its cache when it grows past
    `original`): the runner looks position p of such a request up at row original + p.
    """
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or int(scaling["max_position_embeddings"]) / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:  # the paper's default, as transformers computes it
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    # In fp32, in transformers' order, so the tables match its bit for bit.
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim

    def table(factors: list[float]) -> torch.Tensor:
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**exponents)
        return build_cos_sin_cache(inv_freq, max_positions) * attention_factor

    short, long = table(scaling["short_factor"]), table(scaling["long_factor"])
    return torch.cat((short[:original], long))


class RotaryEmbedding(nn.Module):
    def __init__(self, rotary_dim: int, max_positions: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        if scaling is not None and scaling.get("rope_type") == "longrope":
            cache = longrope_cos_sin_cache(rotary_dim, max_positions, theta, scaling)
        else:
            cache = build_cos_sin_cache(rope_inv_freq(rotary_dim, theta, scaling), max_positions)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
