"""Compute kernels for the engine: Triton on GPU, torch references everywhere.

Every op lives in its own module next to its torch reference; `dispatch.select_ops`
picks the implementation for a device and backend setting. This file imports nothing,
so reading `kernels.backends` (the config does) does not load torch.
"""
