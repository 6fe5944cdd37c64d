"""RMSNorm with an optional fused residual add."""

import torch
import torch.nn.functional as F


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Normalise the last dim in fp32, as Hugging Face's Llama does.

    With `residual`, computes `x + residual` first and returns (normed, new_residual).
    """
    if residual is not None:
        x = x + residual
        residual = x
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        # The same arithmetic in one call (bit-identical in fp32), without a Python-level
        # op per step of the formula.
        out = F.rms_norm(x, (x.shape[-1],), weight, eps)
    else:
        # fp32 statistics as x * rsqrt(mean(x^2) + eps) (fused, bit-identical), cast back,
        # then the weight in x's dtype.
        out = weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(dtype)
    return out if residual is None else (out, residual)
