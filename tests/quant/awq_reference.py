"""An AWQ GEMM-layout reader written from the published format only (AutoAWQ's
`WQLinear_GEMM`), independent of kvdeck's code: the tests check kvdeck against it."""

import torch

# Nibble i (bits 4i..4i+3) of an int32 holds column PUBLISHED_ORDER[i] of its group of 8.
PUBLISHED_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def reference_unpack(packed: torch.Tensor) -> torch.Tensor:
    rows, packs = packed.shape
    out = torch.empty(rows, packs * 8, dtype=torch.int64)
    bits = packed.to(torch.int64) & 0xFFFFFFFF
    for i, column in enumerate(PUBLISHED_ORDER):
        out[:, column::8] = (bits >> (4 * i)) & 0xF
    return out


def reference_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Dense W^T [in, out] in float64."""
    q = reference_unpack(qweight).double()
    z = reference_unpack(qzeros).double()
    s = scales.double()
    rows = torch.arange(q.shape[0]) // group_size
    return (q - z[rows]) * s[rows]
