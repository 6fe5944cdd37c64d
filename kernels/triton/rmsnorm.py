"""Triton RMSNorm with optional fused residual add, stats in fp32.

A program normalises ROWS rows at once (one row for wide hidden sizes, many for per-head
q/k norms), so small rows neither waste GPU lanes nor cost one interpreter program each.
Same contract and rounding as `kernels.rmsnorm.rms_norm_torch` (normalise in fp32, round
to the input dtype, then scale by the weight). Import through `kernels.triton_ops`.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.pdl import pdl_start


@jit(do_not_specialize=('num_rows',))  # batch-dependent: one variant for every value
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_residual, stride_out, stride_residual_out,
    num_rows, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_start(PDL)  # before any load or store (kernels/triton/pdl.py)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < hidden)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual + cols[None, :],
                           mask=mask, other=0.0)
        # Round the sum to the activation dtype first, as the unfused add does.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + rows[:, None] * stride_residual_out + cols[None, :], x,
                 mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, 1) / hidden
    normed = (x32 * tl.rsqrt(variance + eps)[:, None]).to(x.dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             (normed * weight[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    rows = t.reshape(-1, hidden)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Normalise the last dim; with `residual` returns (normed, x + residual). Inputs untouched."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    x_rows = _as_rows(x, hidden)
    weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    out_rows = out.view(-1, hidden)
    if residual is None:
        residual_rows = residual_out_rows = x_rows  # unused placeholders
    else:
        residual_rows = _as_rows(residual, hidden)
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        residual_out_rows = residual_out.view(-1, hidden)
    num_rows = x_rows.shape[0]
    if num_rows > 0 and hidden > 0:
        block = triton.next_power_of_2(hidden)
        rows = rows_per_program(block, x.device)
        launch(_rms_norm_kernel, (triton.cdiv(num_rows, rows),),
            x_rows, residual_rows, weight, out_rows, residual_out_rows,
            x_rows.stride(0), residual_rows.stride(0), out_rows.stride(0),
            residual_out_rows.stride(0), num_rows, hidden, eps,
            HAS_RESIDUAL=residual is not None, ROWS=rows, BLOCK=block,
            num_warps=num_warps_for(rows * block),
        )
    return out if residual is None else (out, residual_out)
