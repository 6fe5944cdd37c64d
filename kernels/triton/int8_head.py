"""Triton W8A16 output head: logits = x @ dequant(q)^T for the output projection of an INT4
model on a GPU, quantised at load to llama.cpp's Q8_0 form (kernels/reference/int8_gemm.py:
int8 [V, H] with one fp16 scale per 32 inputs of a row; the CPU's int8 head is the same form).

The head is a large share of an INT4 model's bytes a decode step reads (Llama-3.2-1B's tied
128256 x 2048 head: 525 MB in bf16, as many as its INT4 layers), and in int8 half of that.
Each program computes a [BLOCK_M, BLOCK_V] tile of logits: per K step (one block of 32
inputs) it loads x's rows and the head's int8 rows with their scales, dequantises in
registers (int8 x fp16 scale, exact in fp32, rounded once to x's dtype as the dense weight
would be) and multiplies on the tensor cores with fp32 sums; the loads are pipelined (sm_90,
decode's tiles: 64 registers, 25 KB of shared memory, no spill). The vocabulary is wide
enough (1002 tiles of 128 at 128256) that no split of K is needed. Same contract as
`int8_head_torch`. Import through `kernels.dispatch.int8_head`.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.int8_gemm import BLOCK
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.pdl import pdl_start
from kvdeck.kernels.triton.tile_dot import dot_flags, tile_dot

_BLOCK = tl.constexpr(BLOCK)  # inputs per scale
# (largest M, BLOCK_M, BLOCK_V, num_warps, num_stages): decode's few rows, then larger steps
# (a prefill's last tokens, batches over 16). Each fits sm_86's 99 KB.
CONFIGS = ((16, 16, 128, 4, 6), (None, 64, 128, 8, 4))


@jit(do_not_specialize=("M",))  # batch-dependent: one variant for every value
def _int8_head_kernel(
    x_ptr, q_ptr, s_ptr, out_ptr, M, V, H, stride_xm, stride_qv, stride_sv, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    pid_v = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = (pid_v * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    mask_m = offs_m < M
    mask_v = offs_v < V
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    q_rows = q_ptr + offs_v[:, None] * stride_qv
    s_rows = s_ptr + offs_v * stride_sv
    # One scale block (32 inputs) a step: its scale is one value a row (no gather), and H is
    # whole blocks (no mask along K, which would keep Triton from pipelining the loads).
    for k0 in range(0, scalar(H), _BLOCK):
        offs_k = k0 + tl.arange(0, _BLOCK)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        q = tl.load(q_rows + offs_k[None, :], mask=mask_v[:, None], other=0)
        scale = tl.load(s_rows + k0 // _BLOCK, mask=mask_v, other=0.0)
        w = (q.to(tl.float32) * scale.to(tl.float32)[:, None]).to(x.dtype)  # [BLOCK_V, 32]
        acc = tile_dot(x, tl.trans(w), acc, DOT_F32, DOT_PRECISION)  # fp32: full precision, not TF32
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_v[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_v[None, :])


def head_config(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_V, num_warps, num_stages) for a step of m rows."""
    return next(config[1:] for config in CONFIGS if config[0] is None or m <= config[0])


def int8_head_triton(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., H] (16-bit or fp32) times the Q8_0 head q [V, H] int8, scales [V, H / 32] fp16:
    logits [..., V] in x's dtype."""
    v, h = q.shape
    if x.shape[-1] != h or scales.shape != (v, h // BLOCK) or h % BLOCK:
        raise ValueError(f"int8 head: x [..., {x.shape[-1]}] does not match q {tuple(q.shape)} and "
                         f"scales {tuple(scales.shape)} (one scale per {BLOCK} inputs)")
    if q.dtype != torch.int8 or q.stride(1) != 1 or scales.stride(1) != 1:
        raise ValueError("int8 head: q must be int8 and q, scales unit-stride along the inputs")
    rows = x.reshape(-1, h)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], v), dtype=x.dtype, device=x.device)
    m = rows.shape[0]
    if m:
        block_m, block_v, warps, stages = head_config(m)
        grid = (triton.cdiv(v, block_v), triton.cdiv(m, block_m))
        launch(_int8_head_kernel, grid, rows, q, scales, out, m, v, h, rows.stride(0), q.stride(0),
               scales.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_V=block_v,
               num_warps=warps, num_stages=stages, **dot_flags(x.dtype))
    return out.view(*x.shape[:-1], v)
