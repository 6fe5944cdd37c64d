"""Gated activations of the MLPs: SiLU-and-mul (Llama, Qwen, Phi-3) and GELU(tanh)-and-mul
(GeGLU: Gemma 2 and 3)."""

import torch
import torch.nn.functional as F


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] holding gate | up; returns silu(gate) * up of shape [..., d]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] holding gate | up; returns gelu_tanh(gate) * up (transformers'
    `gelu_pytorch_tanh`) of shape [..., d]."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# The MLPs' gated activations by name (what a fused epilogue is asked to apply).
GATED_ACTIVATIONS = {"silu": silu_and_mul_torch, "gelu_tanh": gelu_tanh_and_mul_torch}
