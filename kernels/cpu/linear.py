"""Matmuls for small CPU batches: bf16 weights packed for oneDNN, and int8 weight-only.

A batch-1 decode step on CPU is a chain of matrix-vector products whose cost is the bytes
of weights read (one row of activations does too little arithmetic per byte). So fewer
bytes per weight is the lever:
- bf16: oneDNN's GEMM on a weight packed once into its blocked layout reads half of
  fp32's bytes; aten's plain bf16 matmul is slower than that packed one at every batch size.
  For one to four rows kernels/cpu/native.py streams a row-major copy faster still;
- int8 weight-only (one scale per output channel): aten's `_weight_int8pack_mm` reads a
  quarter of fp32's bytes, with bf16 activations (its fp32 path is a slow generic loop).
  It is a matrix-vector kernel: at 64 rows it loses to dequantising the weight and running
  one bf16 GEMM, which is what larger batches (prefill chunks) do.
Figures: benchmarks/bench_cpu_matmul.py, results/cpu_matmul_1thread.json.

The packed product is a registered custom op, so that torch.compile treats it as one
opaque call (inductor's own lowering of oneDNN's linear wants the weight as a constant).
"""

import itertools
import weakref

import torch

# Rows up to which int8 weights go through the matrix-vector kernel; above, dequantise
# and run one bf16 GEMM (results/cpu_matmul_1thread.json: at 16 rows the kernel beats the
# dequantise path on 6 of 7 shapes, at 64 rows it loses on all 7).
INT8_GEMV_MAX_ROWS = 16


def bf16_packing_supported() -> bool:
    """oneDNN is built in and this CPU does bf16 matmuls natively (avx512_bf16 / AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_bf16_weight(weight: torch.Tensor) -> tuple[torch.nn.Parameter, int]:
    """[out, in] bf16 -> (the same weight in oneDNN's blocked layout, an mkldnn parameter
    for the layer to own; the number a compiled graph names it by)."""
    packed = torch.nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1),
                                requires_grad=False)
    number = next(_numbers)
    _packed_weights[number] = packed
    return packed, number


# torch.compile cannot trace an mkldnn (opaque) tensor, so a compiled graph carries a packed
# weight's number and the op looks it up here. Weak values: the layer owns its weight.
_packed_weights: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_numbers = itertools.count()


# Registered with torch.library.Library, not the custom_op decorator, whose Python layers
# cost more per call than a small packed GEMV itself (see kernels/cpu/compiled_ops.py).
_LIBRARY = torch.library.Library("kvdeck", "FRAGMENT")
_LIBRARY.define("packed_linear(Tensor x, Tensor? bias, int weight_number, int out_features) -> Tensor")


def _packed_linear_op(x: torch.Tensor, bias: torch.Tensor | None, weight_number: int,
                      out_features: int) -> torch.Tensor:
    return _packed_linear(x, _packed_weights[weight_number], bias)


_LIBRARY.impl("packed_linear", _packed_linear_op, "CPU")


@torch.library.register_fake("kvdeck::packed_linear")
def _(x, bias, weight_number, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def packed_linear(x: torch.Tensor, weight_number: int, out_features: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] (bf16) times the packed weight `weight_number`. Eagerly a direct call;
    under torch.compile the custom op (the packed tensor itself never enters the graph)."""
    if torch.compiler.is_compiling():
        return torch.ops.kvdeck.packed_linear(x, bias, weight_number, out_features)
    return _packed_linear(x, _packed_weights[weight_number], bias)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: (qweight [out, in] int8, scales [out] fp32) with
    weight ~= qweight * scales[:, None]."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    qweight = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return qweight, scales


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] times an int8 weight with bf16 per-channel `scales`; the result in x's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] <= INT8_GEMV_MAX_ROWS and flat.device.type == "cpu":
        out = torch._weight_int8pack_mm(flat.to(torch.bfloat16), qweight, scales)
    else:
        weight = qweight.to(torch.bfloat16) * scales[:, None]
        out = torch.nn.functional.linear(flat.to(torch.bfloat16), weight)
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], out.shape[-1])
