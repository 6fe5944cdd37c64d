"""One place that decides which implementation of each op the engine runs: a backend's
`KernelOps` per device (`select_ops`), and per call the W4A16 GEMM (`w4a16_gemm`).

The backends live in kernels/reference/ (torch), kernels/triton/ and kernels/cpu/. The
Triton modules are imported only when chosen: `triton.jit` decides compiled vs
interpreted when a kernel module is first imported (TRITON_INTERPRET=1 must be set before).
"""

import os

import torch

from kvdeck.kernels.cpu.ops import TORCH_OPS
from kvdeck.kernels.ops import KERNEL_BACKENDS, KernelOps
from kvdeck.kernels.reference.w4a16_gemm import w4a16_gemm_torch

__all__ = ["TORCH_OPS", "KernelOps", "select_ops", "triton_interpreter_enabled", "w4a16_gemm"]


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def select_ops(backend: str, device: torch.device) -> KernelOps:
    """`auto`: Triton on CUDA, torch elsewhere. `triton` anywhere (CPU needs TRITON_INTERPRET=1)."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"attention_backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return TORCH_OPS
    if device.type != "cuda" and not triton_interpreter_enabled():
        raise ValueError(
            "attention_backend='triton' on CPU needs TRITON_INTERPRET=1 set before kvdeck starts"
        )
    from kvdeck.kernels.triton.ops import TRITON_OPS

    return TRITON_OPS


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """y = x @ dequant(AWQ tensors) (+ bias). `auto`: Triton on CUDA (the fused GEMM for
    small M, a device-side dequantise plus cuBLAS for large M), the torch reference
    elsewhere. `triton` forces the Triton path (on CPU it needs TRITON_INTERPRET=1), `torch`
    the reference."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"w4a16 backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return w4a16_gemm_torch(x, qweight, qzeros, scales, group_size, bias)
    from kvdeck.kernels.triton.w4a16_gemm import w4a16_gemm_triton

    return w4a16_gemm_triton(x, qweight, qzeros, scales, group_size, bias)
