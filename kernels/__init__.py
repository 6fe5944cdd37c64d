"""Compute kernels for the engine, by backend: `reference/` (torch, the contract and the
path wherever nothing faster applies), `triton/` (GPU) and `cpu/` (native C). `ops.py`
holds what they share; `dispatch.py` picks one per device (and the W4A16 GEMM per call).
This file imports nothing, so reading `kernels.ops` (the config does) does not load torch.
"""
