"""The two searches of AWQ (arXiv 2306.00978), on one decoder layer at a time.

Scale search: salient input channels (large mean |activation|) are scaled up by s before
quantisation and the input is scaled by 1/s (folded into the preceding norm or linear),
so their weights lose less precision. s = x_mean^a / w_mean^(1-a) (AutoAWQ's "duo
scaling"; the paper's s = x_mean^a when `duo_scaling` is off), with a on a grid of
`n_grid` points in [0, 1), chosen to minimise the output error of the block the
scaled linears feed.

Clip search: per (output row, group), shrink the weight range to max|w| * (1 - i/n_grid)
for i < max_shrink * n_grid, keeping the value that minimises that group's partial
output error on sampled calibration tokens.
"""

from collections.abc import Callable

import torch
from torch import nn

from kvdeck.quant.packing import fake_quantize

BlockForward = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def search_scale(
    block_forward: BlockForward,
    linears: list[nn.Linear],
    x: torch.Tensor,
    group_size: int,
    n_grid: int = 20,
    duo_scaling: bool = True,
    on_grid_point: Callable[[int], None] | None = None,
    x_mean: torch.Tensor | None = None,
) -> torch.Tensor:
    """Best per-input-channel scales [in] for `linears`, which all read `x` [..., in].

    `block_forward(x)` runs the block whose output error is scored (the attention for
    q/k/v, the MLP for gate/up, or the linear itself); it reads the linears' weights
    as they are at call time. `on_grid_point(i)` is told after each grid point is scored
    (progress reports: one block forward over the calibration batch each). `x_mean`: the
    mean |activation| per channel where it comes from more tokens than `x` (the losses are
    scored on a subsample of the calibration set, the statistics taken on all of it).
    """
    weight = torch.cat([layer.weight for layer in linears], dim=0)
    w_abs = weight.abs().float().reshape(-1, group_size)
    w_norm = w_abs / (w_abs.amax(dim=1, keepdim=True) + 1e-6)
    w_mean = w_norm.reshape(weight.shape).mean(dim=0)
    if x_mean is None:
        x_mean = channel_means(x)

    reference = block_forward(x).float()
    originals = [layer.weight.data.clone() for layer in linears]
    best_loss, best_scales = float("inf"), None
    try:
        for step in range(n_grid):
            alpha = step / n_grid
            if duo_scaling:
                scales = x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)
            else:
                scales = x_mean.pow(alpha)
            scales = scales.clamp(min=1e-4)
            scales = scales / (scales.max() * scales.min()).sqrt()
            scales = torch.nan_to_num(scales, nan=1.0, posinf=1.0)
            for layer, original in zip(linears, originals, strict=True):
                scaled = original.float() * scales
                layer.weight.data = (fake_quantize(scaled, group_size) / scales).to(original.dtype)
            loss = (block_forward(x).float() - reference).pow(2).mean().item()
            if loss < best_loss:
                best_loss, best_scales = loss, scales.clone()
            if on_grid_point is not None:
                on_grid_point(step + 1)
    finally:
        for layer, original in zip(linears, originals, strict=True):
            layer.weight.data = original
    if best_scales is None:
        raise ValueError("AWQ scale search found no finite loss (NaN/inf activations?)")
    return best_scales


def channel_means(x: torch.Tensor) -> torch.Tensor:
    """Mean |x| per input channel over every token, in fp32."""
    return x.abs().reshape(-1, x.shape[-1]).float().mean(dim=0)


@torch.no_grad()
def search_clip(
    weight: torch.Tensor,
    x: torch.Tensor,
    group_size: int,
    n_grid: int = 20,
    max_shrink: float = 0.5,
    max_tokens: int = 512,
    rows_per_batch: int = 256,
) -> torch.Tensor:
    """Best clipping threshold [out, in/group] for W [out, in] reading inputs x [..., in]."""
    out_features, in_features = weight.shape
    num_groups = in_features // group_size
    x = x.reshape(-1, in_features)
    x = x[:: max(1, x.shape[0] // max_tokens)].float()
    x_groups = x.reshape(-1, num_groups, group_size).transpose(0, 1)  # [groups, tokens, g]
    best = []
    for start in range(0, out_features, rows_per_batch):
        w = weight[start:start + rows_per_batch].float()
        w_groups = w.reshape(-1, num_groups, group_size).transpose(0, 1)  # [groups, rows, g]
        # Partial outputs of each group: [groups, tokens, rows].
        reference = torch.bmm(x_groups, w_groups.transpose(1, 2))
        max_abs = w_groups.abs().amax(dim=-1, keepdim=True)  # [groups, rows, 1]
        best_max = max_abs.clone()
        best_err = torch.full_like(max_abs, float("inf"))
        for step in range(int(max_shrink * n_grid)):
            limit = max_abs * (1 - step / n_grid)
            clipped = torch.maximum(torch.minimum(w_groups, limit), -limit)
            quantised = fake_quantize(
                clipped.transpose(0, 1).reshape(w.shape), group_size
            ).reshape(-1, num_groups, group_size).transpose(0, 1)
            out = torch.bmm(x_groups, quantised.transpose(1, 2))
            err = (out - reference).pow(2).mean(dim=1).unsqueeze(-1)  # [groups, rows, 1]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, limit, best_max)
        best.append(best_max.squeeze(-1).transpose(0, 1))  # [rows, groups]
    return torch.cat(best, dim=0)


@torch.no_grad()
def apply_clip(layer: nn.Linear, max_val: torch.Tensor, group_size: int) -> None:
    w = layer.weight.data
    groups = w.reshape(w.shape[0], -1, group_size)
    limit = max_val.to(w.dtype).unsqueeze(-1)
    layer.weight.data = torch.maximum(torch.minimum(groups, limit), -limit).reshape(w.shape)


@torch.no_grad()
def fold_scales_into_norm(norm: nn.Module, linears: list[nn.Linear], scales: torch.Tensor) -> None:
    """norm(x) * w -> (norm(x) / s) * (w * s): the same output, with salient channels scaled."""
    norm.weight.data = (norm.weight.float() / scales).to(norm.weight.dtype)
    if getattr(norm, "bias", None) is not None:
        norm.bias.data = (norm.bias.float() / scales).to(norm.bias.dtype)
    _scale_inputs(linears, scales)


@torch.no_grad()
def fold_scales_into_linear(
    previous: nn.Linear, linears: list[nn.Linear], scales: torch.Tensor
) -> None:
    """The previous linear's output rows (v for o, up for down) absorb 1/s."""
    rows = previous.weight.data[-scales.numel():]
    previous.weight.data[-scales.numel():] = (rows.float() / scales[:, None]).to(rows.dtype)
    if previous.bias is not None:
        bias = previous.bias.data[-scales.numel():]
        previous.bias.data[-scales.numel():] = (bias.float() / scales).to(bias.dtype)
    _scale_inputs(linears, scales)


def _scale_inputs(linears: list[nn.Linear], scales: torch.Tensor) -> None:
    for layer in linears:
        layer.weight.data = (layer.weight.float() * scales).to(layer.weight.dtype)
