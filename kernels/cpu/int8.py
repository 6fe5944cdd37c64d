"""INT8 weights on the CPU (int8.c): a dense weight quantised at load to llama.cpp's Q8_0 form
(kernels/reference/int8_gemm.py) and repacked into int8.h's tiles, and its product with bf16
or fp32 activations (quantised to int8 per block of 32 inside). An INT4 model's output head
runs it: a third of the bytes bf16 would read, where llama.cpp's Q4 files keep theirs too."""

import ctypes
from dataclasses import dataclass

import torch

from kvdeck.kernels.cpu import build
from kvdeck.kernels.reference.int8_gemm import dequantize_int8_blocks, quantize_int8_blocks

TILE = 16  # output columns of a tile
TILE_K = 64  # k of a tile's step: 64 bytes of scales, then 16 chunks of 64 bytes


class _Q8Weight(ctypes.Structure):  # int8.h's kvdeck_q8_weight
    _fields_ = [("data", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64)]


@dataclass(slots=True)
class Int8Weight:
    """A weight [n, k] as q8 tiles, ready for `gemm`."""

    tiles: torch.Tensor
    n: int
    k: int
    struct: _Q8Weight

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)


def available() -> bool:
    return build.int4_isa() > 0  # the same integer dot products as the INT4 kernel


def takes(weight: torch.Tensor) -> bool:
    """Whether a dense [n, k] weight can become tiles (k a multiple of 64)."""
    return weight.dim() == 2 and weight.shape[1] % TILE_K == 0 and weight.shape[0] > 0


def from_dense(weight: torch.Tensor) -> Int8Weight:
    """Quantise [n, k] to int8 per block of 32 (`quantize_int8_blocks`) and repack."""
    if not takes(weight):
        raise ValueError(f"INT8 tiles need a 2-d weight whose input size is a multiple of {TILE_K}, got "
                         f"{tuple(weight.shape)}")
    q, scales = quantize_int8_blocks(weight.detach().cpu())
    return repack(q, scales)


def repack(q: torch.Tensor, scales: torch.Tensor) -> Int8Weight:
    """q [n, k] int8 and scales [n, k / 32] fp16 -> tiles."""
    n, k = q.shape
    padded = -(-n // TILE) * TILE
    tiles, steps = padded // TILE, k // TILE_K
    q = torch.nn.functional.pad(q, (0, 0, 0, padded - n))
    scales = torch.nn.functional.pad(scales, (0, 0, 0, padded - n))
    # chunk c of a step: k = 4c + i of the tile's 16 columns j, byte 4j + i
    weights = q.view(tiles, TILE, steps, 16, 4).permute(0, 2, 3, 1, 4).reshape(tiles, steps, 16 * 64)
    params = scales.view(tiles, TILE, steps, 2).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
    data = torch.cat([params.reshape(tiles, steps, 64), weights.view(torch.uint8)], dim=2).reshape(-1)
    data = data.contiguous()
    expected = tiles * build.require().kvdeck_q8_tile_bytes(k)
    if data.numel() != expected:
        raise AssertionError(f"repacked {data.numel()} bytes, the kernel reads {expected}")
    return Int8Weight(data, n, k, _Q8Weight(data.data_ptr(), n, k))


_GEMM_FUNCTIONS = {torch.bfloat16: "kvdeck_q8_gemm_bf16", torch.float32: "kvdeck_q8_gemm_f32"}


def gemm(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """x [..., k] (bf16 or fp32, CPU) times the INT8 weight transposed: [..., n] in x's dtype."""
    library = build.require()
    function = _GEMM_FUNCTIONS.get(x.dtype)
    flat = x.reshape(-1, x.shape[-1])
    if (function is None or flat.shape[-1] != weight.k or flat.stride(-1) != 1 or flat.device.type != "cpu"
            or flat.shape[0] == 0):
        raise ValueError(f"int8 gemm wants bf16 or fp32 CPU rows x [.., {weight.k}] with a contiguous last "
                         f"dim, got {x.dtype} {tuple(x.shape)} on {x.device}")
    out = torch.empty((flat.shape[0], weight.n), dtype=x.dtype)
    status = getattr(library, function)(flat.data_ptr(), flat.shape[0], flat.stride(0),
                                        ctypes.byref(weight.struct), out.data_ptr(), weight.n, None)
    if status != 0:
        raise RuntimeError("the CPU INT8 kernel refused the call (no integer dot product in this build)")
    return out.view(*x.shape[:-1], weight.n)


def dequantize(weight: Int8Weight) -> torch.Tensor:
    """The dense weight [n, k] fp32 the tiles stand for (q * scale), read back from them."""
    tiles, steps = -(-weight.n // TILE), weight.k // TILE_K
    data = weight.tiles.view(tiles, steps, 64 + 16 * 64)
    scales = data[:, :, :64].contiguous().view(torch.float16).view(tiles, steps, 2, TILE)
    q = data[:, :, 64:].contiguous().view(torch.int8).view(tiles, steps, 16, TILE, 4)
    q = q.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, weight.k)[:weight.n]
    scales = scales.permute(0, 3, 1, 2).reshape(tiles * TILE, steps * 2)[:weight.n]
    return dequantize_int8_blocks(q, scales)
