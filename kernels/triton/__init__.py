"""The Triton kernels (GPU, or the interpreter with TRITON_INTERPRET=1 set before import).

Nothing here is imported until `kernels.dispatch` chooses Triton: `triton.jit` decides
compiled vs interpreted when a kernel module is first imported."""
