"""Which W4A16 kernel serves INT4 (AWQ, GPTQ) layers, from light facts and without torch, so
the CLI and the TUI (which imports no torch) can say it: KVDECK_W4A16_KERNEL (`w4a16_kernel`,
what kernels.dispatch and the linear methods read at load) and `w4a16_serving_kernel`, the
name `kvdeck models` and the Models screen show. The rules mirror quant/awq_linear.py's
choice with the default backend ("auto"): the Triton GEMM on CUDA (the `marlin` kernel on
the repacked layout when chosen), the CPU INT4 kernels where this CPU has them, else the
torch reference's dequantise-then-matmul.
"""

import os

# KVDECK_W4A16_KERNEL: `awq`, the split-K GEMM on AutoAWQ's layout (kernels/triton/w4a16_gemm.py);
# `marlin`, the layers repacked at load for kernels/triton/w4a16_marlin.py; `auto`, W4A16_AUTO.
W4A16_KERNELS = ("auto", "awq", "marlin")
# What `auto` means until a GPU run of the battery's w4a16 stage (benchmarks/bench_w4a16.py,
# both kernels beside cuBLAS under CUDA graphs) shows the repacked kernel faster.
W4A16_AUTO = "marlin"
W4A16_METHODS = ("awq", "gptq")


def w4a16_kernel() -> str:
    """The W4A16 kernel CUDA layers use, from KVDECK_W4A16_KERNEL (read at load): awq or marlin."""
    kernel = os.environ.get("KVDECK_W4A16_KERNEL", "auto").strip().lower() or "auto"
    if kernel not in W4A16_KERNELS:
        raise ValueError(f"KVDECK_W4A16_KERNEL must be one of {W4A16_KERNELS}, got {kernel!r}")
    return W4A16_AUTO if kernel == "auto" else kernel


def is_w4a16(quantization: str | None) -> bool:
    """Whether a checkpoint's quantisation label ("awq-int4", "gptq-int4", "awq"; as
    app/store/inspect.py's `quantization_of` writes it) is INT4 weights the W4A16 kernels run."""
    if not quantization:
        return False
    method, _, bits = quantization.lower().partition("-")
    return method in W4A16_METHODS and bits in ("", "int4")


def w4a16_serving_kernel(on_cuda: bool, cpu_int4: bool) -> str:
    """The kernel a W4A16 layer runs with the default backend: `on_cuda` when the engine runs
    on a GPU, `cpu_int4` when this CPU has kvdeck's INT4 kernels (kernels/cpu/int4.py)."""
    if on_cuda:
        if w4a16_kernel() == "marlin":
            return "triton w4a16 marlin (repacked at load)"
        return "triton w4a16 (AutoAWQ layout)"
    if cpu_int4:
        return "cpu int4 kernels"
    return "torch reference (dequantise + matmul)"
