"""A tile product whose inputs may be bf16 under the interpreter (the int8 head, the grouped
LoRA kernels): `tile_dot` and the constexprs its kernels take, `dot_flags(dtype)`.

Compiled, 16-bit inputs multiply on the tensor cores with fp32 sums (TF32 is only a name
here: the products of 16-bit values are exact), and fp32 inputs at full precision
(`ieee`, not TF32, so an fp32 model's sums are those of its dense reference). The
interpreter has no bf16 product: there the same values are multiplied in fp32.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.triton.launch import INTERPRETING


@triton.jit
def tile_dot(a, b, acc, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b (fp32)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


def dot_flags(dtype: torch.dtype) -> dict:
    """DOT_F32 and DOT_PRECISION for a kernel whose tile products take `dtype` inputs."""
    return dict(DOT_F32=INTERPRETING and dtype == torch.bfloat16,
                DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
