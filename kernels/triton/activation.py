"""Triton gated activations: out = act(gate) * up for x = gate | up along the last dim, act
SiLU or GELU with the tanh approximation (GeGLU).

Rounds like `kernels.activation` (the activation rounded to the input dtype before the
product). Import through `kernels.triton_ops`. `gated_product` is the same arithmetic for a
GEMM epilogue that applies the activation itself (kernels/triton/w4a16_marlin.py).
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start

MAX_BLOCK = 1024  # columns per program; wider rows take several programs
SILU, GELU_TANH = 0, 1  # the ACT argument
NO_ACTIVATION = -1  # a GEMM epilogue's ACT when it stores the product itself
ACTIVATION_CODES = {"silu": SILU, "gelu_tanh": GELU_TANH}  # kernels/reference/activation.py's names
# Globals a jitted kernel reads must be constexpr objects (the interpreter does not check).
_SILU = tl.constexpr(SILU)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@jit(do_not_specialize=('num_rows',))  # batch-dependent: one variant for every value
def _act_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, num_rows, d, ACT: tl.constexpr, ROWS: tl.constexpr,
    BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < d)
    gate_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0)
    up = tl.load(gate_ptrs + d, mask=mask, other=0.0)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             gated_product(gate, up, ACT).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gated_product(gate, up, ACT: tl.constexpr):
    """act(gate) * up in fp32 for gate and up in their stored dtype, the activation rounded to
    that dtype before the product (as kernels/reference/activation.py's torch ops round)."""
    g = gate.to(tl.float32)
    if ACT == _SILU:
        act = g / (1.0 + tl.exp(-g))
    else:  # tanh(u) = 2 sigmoid(2u) - 1: Triton has no tanh of its own
        u = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * u)))
    act = act.to(gate.dtype).to(tl.float32)
    return act * up.to(tl.float32)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] holding gate | up; returns silu(gate) * up, [..., d]."""
    return _act_and_mul(x, SILU)


def gelu_tanh_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] holding gate | up; returns gelu_tanh(gate) * up, [..., d]."""
    return _act_and_mul(x, GELU_TANH)


def gated_activation_triton(x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up by name (kernels/reference/activation.py's GATED_ACTIVATIONS' names)."""
    return _act_and_mul(x, activation_code(activation))


def activation_code(activation: str) -> int:
    """The ACT code of a gated activation's name; ValueError naming the known ones."""
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"unknown gated activation {activation!r}; known: {', '.join(ACTIVATION_CODES)}")
    return ACTIVATION_CODES[activation]


def _act_and_mul(x: torch.Tensor, act: int) -> torch.Tensor:
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"last dim of x must be even (gate | up), got shape {tuple(x.shape)}")
    d = x.shape[-1] // 2
    x_rows = x.reshape(-1, 2 * d)
    if x_rows.stride(-1) != 1:
        x_rows = x_rows.contiguous()
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    out_rows = out.view(-1, d)
    num_rows = x_rows.shape[0]
    if num_rows > 0 and d > 0:
        block = min(MAX_BLOCK, triton.next_power_of_2(d))
        rows = rows_per_program(block, x.device)
        launch(_act_and_mul_kernel, (triton.cdiv(num_rows, rows), triton.cdiv(d, block)),
            x_rows, out_rows, x_rows.stride(0), out_rows.stride(0), num_rows, d, ACT=act,
            ROWS=rows, BLOCK=block, num_warps=num_warps_for(rows * block),
        )
    return out
