"""An INT4 model's output head in int8 on a GPU (W8A16): the head quantised at load to
llama.cpp's Q8_0 form (kernels/reference/int8_gemm.py: symmetric, one fp16 scale per 32
inputs of a row) and multiplied by `kernels.dispatch.int8_head` (Triton on CUDA), the
activations in the model's dtype.

AutoAWQ and GPTQ leave the head dense, so in an INT4 model it is a large share of a decode
step's bytes: Llama-3.2-1B's tied 128256 x 2048 head is 525 MB in bf16, as many as all its
INT4 layers; in int8 it is half. The CPU does the same with its own kernel
(engine/runner/models/linear.py's Int8OutputHead), and llama.cpp's Q4 files keep theirs at
Q8_0 or better. KVDECK_INT8_HEAD=0 keeps the head dense (on the CPU too). A tied head's
embedding keeps its own tensor for the row lookups.
"""

import os

import torch
from torch import nn

from kvdeck.kernels.dispatch import int8_head
from kvdeck.kernels.ops import env_switch
from kvdeck.kernels.reference.int8_gemm import BLOCK, quantize_int8_blocks

INT8_HEAD_ENV = "KVDECK_INT8_HEAD"
_QUANTISE_ROWS = 8192  # rows quantised at a time: the fp32 working copy stays small


def int8_head_setting(environ=os.environ) -> bool:
    """KVDECK_INT8_HEAD: 1 (the default) puts an INT4 model's output head in int8 where a
    kernel serves it, 0 keeps it dense."""
    return env_switch(INT8_HEAD_ENV, True, environ)


class W8A16OutputHead(nn.Module):
    """The output projection on an int8 copy of its weight (tied: the embedding stays dense)."""

    def __init__(self, weight: torch.Tensor, backend: str = "auto") -> None:
        super().__init__()
        chunks = [quantize_int8_blocks(rows) for rows in weight.data.split(_QUANTISE_ROWS)]
        self.qweight = nn.Parameter(torch.cat([q for q, _ in chunks]), requires_grad=False)
        self.scales = nn.Parameter(torch.cat([s for _, s in chunks]), requires_grad=False)
        self.backend = backend

    @staticmethod
    def takes(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        return (bias is None and weight.dim() == 2 and weight.shape[1] % BLOCK == 0
                and weight.is_floating_point())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return int8_head(hidden, self.qweight, self.scales, self.backend)
