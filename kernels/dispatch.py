"""One place that decides which implementation of each op the engine runs: a backend's
`KernelOps` per device (`select_ops`), per call the W4A16 GEMM (`w4a16_gemm`), and which
W4A16 kernel CUDA layers use (`w4a16_kernel`: KVDECK_W4A16_KERNEL; `marlin` layers are
repacked at load and run `w4a16_gemm_repacked`), and the name of what serves a W4A16 model on
this machine (kernels/w4a16_choice.py, torch-free for `kvdeck models` and the Models screen).

The backends live in kernels/reference/ (torch), kernels/triton/ and kernels/cpu/. The
Triton modules are imported only when chosen: `triton.jit` decides compiled vs
interpreted when a kernel module is first imported (TRITON_INTERPRET=1 must be set before).
"""

import os
from collections.abc import Callable

import torch

from kvdeck.kernels.cpu.ops import TORCH_OPS
from kvdeck.kernels.ops import KERNEL_BACKENDS, KernelOps
from kvdeck.kernels.reference.int8_gemm import int8_head_torch
from kvdeck.kernels.reference.lora import lora_linear_delta as lora_linear_delta_torch
from kvdeck.kernels.reference.lora_tiles import RowTiles
from kvdeck.kernels.reference.w4a16_gemm import w4a16_gemm_torch
from kvdeck.kernels.reference.w4a16_repack import (
    RepackedW4,
    w4a16_gated_repacked_torch,
    w4a16_gemm_repacked_torch,
)
from kvdeck.kernels.w4a16_choice import W4A16_AUTO, W4A16_KERNELS, w4a16_kernel

__all__ = ["TORCH_OPS", "W4A16_AUTO", "W4A16_KERNELS", "KernelOps", "int8_head", "lora_linear",
           "lora_shrink_splits", "lora_tile_rows", "select_ops", "triton_interpreter_enabled",
           "w4a16_gated_repacked", "w4a16_gemm", "w4a16_gemm_repacked", "w4a16_kernel"]


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


def w4a16_gemm_repacked(x: torch.Tensor, weight: RepackedW4, bias: torch.Tensor | None = None,
                        backend: str = "auto") -> torch.Tensor:
    """y = x @ dequant(weight) (+ bias) for a layer repacked at load (the `marlin` kernel):
    Triton on CUDA (or with `triton`, under TRITON_INTERPRET=1 on CPU), else the reference."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"w4a16 backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return w4a16_gemm_repacked_torch(x, weight, bias)
    from kvdeck.kernels.triton.w4a16_marlin import w4a16_gemm_marlin

    return w4a16_gemm_marlin(x, weight, bias)


def w4a16_gated_repacked(x: torch.Tensor, weight: RepackedW4, activation: str,
                         bias: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """act(gate) * up of a gate | up layer repacked with its columns paired
    (kernels/reference/w4a16_repack.py's `pair_halves`), [M, N/2]: on the Triton path the
    GEMM's epilogue applies the activation (no activation launch); else the reference."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"w4a16 backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return w4a16_gated_repacked_torch(x, weight, activation, bias)
    from kvdeck.kernels.triton.w4a16_marlin import w4a16_gemm_marlin

    return w4a16_gemm_marlin(x, weight, bias, activation)


def int8_head(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """logits = x @ dequant(q)^T for an output head in Q8_0 int8 (kernels/reference/int8_gemm.py),
    the activations in their own dtype: Triton on CUDA (or with `triton`, under the
    interpreter on CPU), else the torch reference."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"int8 head backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return int8_head_torch(x, q, scales)
    from kvdeck.kernels.triton.int8_head import int8_head_triton

    return int8_head_triton(x, q, scales)


def lora_linear(x: torch.Tensor, base: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor,
                b: torch.Tensor, rows: torch.Tensor | None, row_slots: torch.Tensor, output_sizes: list[int],
                rank: int, num_slots: int | None = None, backend: str = "auto",
                slot_ranks: torch.Tensor | None = None, tiles: RowTiles | None = None) -> torch.Tensor:
    """base(x) plus each adapter row's LoRA delta (shrink, then expand; contract
    kernels/reference/lora.py). `auto`: Triton on CUDA, the torch reference elsewhere.
    `slot_ranks` (int32 [slots]): each slot's own rank, which the Triton pair reads so a row
    loads only its adapter's ranks (the zero padding past them adds nothing either way). The
    Triton pair may run its shrink beside `base` (its launch config's `overlap`). `tiles` (the
    step's tiles of rows, where `lora_tile_rows` says the device's config is grouped): the
    grouped kernels over them (with `slot_ranks`); `rows`/`row_slots` are then unused."""
    if backend == "torch" or (backend == "auto" and x.device.type != "cuda"):
        return lora_linear_delta_torch(x, base(x), a, b, rows, row_slots, output_sizes, rank, num_slots)
    if tiles is not None:
        from kvdeck.kernels.triton.launch import device_arch
        from kvdeck.kernels.triton.lora_grouped import grouped_linear
        from kvdeck.kernels.triton.lora_plan import lora_kernel_config

        return grouped_linear(x, base, a, b, tiles, slot_ranks, output_sizes, rank,
                              lora_kernel_config(device_arch(x.device)))
    from kvdeck.kernels.triton.lora import lora_linear_triton

    return lora_linear_triton(x, base, a, b, rows, row_slots, output_sizes, rank, slot_ranks)


def lora_tile_rows(device: torch.device, backend: str = "auto") -> int:
    """The grouped LoRA kernels' rows per tile where `device` serves them (its launch config
    says `grouped`, kernels/triton/lora_plan.py), else 0: the engine builds each step's tiles
    (kernels/reference/lora_tiles.py) only then."""
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return 0
    from kvdeck.kernels.triton.launch import device_arch
    from kvdeck.kernels.triton.lora_plan import GROUP_ROWS, lora_kernel_config

    return GROUP_ROWS if lora_kernel_config(device_arch(device)).grouped else 0


def lora_shrink_splits(in_size: int, device: torch.device) -> int:
    """How many chunks the Triton shrink cuts a row's `in_size` inputs into on `device` (its
    launch config, kernels/triton/lora_plan.py): the warm-up's rank classes depend on it."""
    from kvdeck.kernels.triton.launch import device_arch
    from kvdeck.kernels.triton.lora_plan import lora_kernel_config

    return lora_kernel_config(device_arch(device)).num_splits(in_size)
