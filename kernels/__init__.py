"""Compute kernels for the engine: Triton on GPU, torch references everywhere.

Every op lives in its own module next to its torch reference; `dispatch.select_ops`
picks the implementation for a device and `attention_backend` setting.
"""

from kernels.dispatch import KernelOps, select_ops

__all__ = ["KernelOps", "select_ops"]
