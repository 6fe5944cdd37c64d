"""SiLU-and-mul, the gated activation of Llama-style MLPs."""

import torch
import torch.nn.functional as F


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] holding gate | up; returns silu(gate) * up of shape [..., d]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
