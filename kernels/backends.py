"""The kernel backends a user can choose (no torch or triton import: the config reads it)."""

KERNEL_BACKENDS = ("auto", "triton", "torch")  # auto: Triton on CUDA, torch elsewhere
