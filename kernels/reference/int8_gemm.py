"""INT8 weights in llama.cpp's Q8_0 form (symmetric, one fp16 scale per 32 input values of an
output row), the torch reference of the CPU kernel kernels/cpu/int8.c."""

import torch

from kvdeck.kernels.reference.w4a16_gemm import quantize_activations_q8

BLOCK = 32


def quantize_int8_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [n, k] -> (q [n, k] int8, scales [n, k / 32] fp16) with weight ~= q * scale:
    scale = amax / 127 rounded to fp16, q = round-half-even(weight / scale) within +-127."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"INT8 blocks need an input size that is a multiple of {BLOCK}, got {k}")
    blocks = weight.float().reshape(n, k // BLOCK, BLOCK)
    scales = (blocks.abs().amax(dim=-1) / 127.0).half()
    divisor = scales.float().unsqueeze(-1)
    q = torch.where(divisor > 0, blocks / divisor.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    return torch.round(q).clamp_(-127, 127).to(torch.int8).reshape(n, k), scales


def dequantize_int8_blocks(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    return (q.float().view(n, k // BLOCK, BLOCK) * scales.float().unsqueeze(-1)).view(n, k)


def int8_head_torch(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What the GPU's int8 output head computes (kernels/triton/int8_head.py; W8A16: the
    activations stay in their dtype): x [..., k] times the dequantised weight [n, k] rounded to
    x's dtype, transposed, summed in fp32; the result in x's dtype."""
    weight = dequantize_int8_blocks(q, scales).to(x.dtype).float()
    out = x.reshape(-1, x.shape[-1]).float() @ weight.t()
    return out.to(x.dtype).view(*x.shape[:-1], q.shape[0])


def int8_gemm_q8_torch(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What the CPU INT8 kernel computes: x [..., k] quantised to int8 per block of 32, times
    the dequantised weight [n, k] transposed, in fp32; the result in x's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    x8, block_scales = quantize_activations_q8(flat, BLOCK)
    activations = (x8.view(flat.shape[0], -1, BLOCK) * block_scales.unsqueeze(-1)).reshape(flat.shape)
    out = activations @ dequantize_int8_blocks(q, scales).t()
    return out.to(x.dtype).view(*x.shape[:-1], q.shape[0])
