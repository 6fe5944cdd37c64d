"""INT4 weights on the CPU: AutoAWQ's tensors repacked at load into int4.c's tiles, and
their product with bf16 or fp32 activations (quantised to int8 per block of 32 inside).

The tiles keep the weights 4-bit in memory (a little more than AutoAWQ's bytes: fp16 scales
and u8 zero points per group of each 16 columns), so a decode step reads about a quarter
of what the bf16 model reads; int4.h has the layout, int4.c the arithmetic and why. The
reference for what `gemm` computes is kernels/reference/w4a16_gemm.py's
`w4a16_gemm_q8_torch`: the same activation quantisation bit for bit, fp32 sums in another
order.
"""

import ctypes
from dataclasses import dataclass

import torch

from kvdeck.kernels.cpu import build
from kvdeck.kernels.reference.w4a16_gemm import unpack_int4

TILE = 16  # output columns of a tile
PARAMS = 64  # bytes of a group's parameters in a tile: 16 fp16 scales, 16 u8 zeros, 16 unused
ACTIVATION_BLOCK = 32  # activations are quantised to int8 per this many values along k
GROUP_SIZES = (32, 64, 128)


class _Q4Weight(ctypes.Structure):  # int4.h's kvdeck_q4_weight
    _fields_ = [("data", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("group", ctypes.c_int64)]


@dataclass(slots=True)
class Int4Weight:
    """One linear layer's weight [k -> n] as q4 tiles (`tiles`, uint8), ready for `gemm`."""

    tiles: torch.Tensor
    n: int
    k: int
    group: int
    struct: _Q4Weight

    @property
    def nbytes(self) -> int:
        return self.tiles.numel()

    @property
    def shape(self) -> tuple[int, int]:
        """[out, in], as a dense weight's."""
        return (self.n, self.k)


def available() -> bool:
    """This CPU runs the INT4 kernels (AVX-512 VNNI, or AVX2), and they are not switched off."""
    return build.int4_isa() > 0


def isa_name() -> str:
    return {2: "AVX-512 VNNI", 1: "AVX2"}.get(build.int4_isa(), "none")


def why_not_repackable(k: int, n: int, group_size: int, scales: torch.Tensor) -> str | None:
    """Why AutoAWQ tensors of this shape cannot become tiles, or None when they can."""
    if group_size not in GROUP_SIZES:
        return f"group size {group_size} (the CPU kernel takes {GROUP_SIZES})"
    if k % group_size:
        return f"input size {k} is not a multiple of the group size {group_size}"
    if n % 8:
        return f"output size {n} is not a multiple of 8"
    finite = scales.float()
    if not torch.equal(finite.half().float(), finite):
        return "scales that fp16 does not hold exactly"
    return None


def repack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> Int4Weight:
    """AutoAWQ's qweight [k, n/8], qzeros [k/G, n/8] (int32) and scales [k/G, n] -> tiles.
    Lossless: `dequantize(repack_awq(...))` equals the reference's dequantised weight."""
    k, n = qweight.shape[0], scales.shape[1]
    why = why_not_repackable(k, n, group_size, scales)
    if why is not None:
        raise ValueError(f"these INT4 weights do not repack for the CPU kernel: {why}")
    groups, chunks = k // group_size, group_size // 8
    padded = -(-n // TILE) * TILE
    tiles = padded // TILE
    q = _pad_columns(unpack_int4(qweight.cpu()), padded)  # [k, padded], 0..15
    zeros = _pad_columns(unpack_int4(qzeros.cpu()), padded)  # [groups, padded]
    half_scales = _pad_columns(scales.cpu().half(), padded)
    # k = g * G + c * 8 + i: the low nibble of byte 4j + i holds i < 4, the high one i + 4.
    q = q.view(groups, chunks, 8, tiles, TILE)
    packed = (q[:, :, :4] | (q[:, :, 4:] << 4)).permute(3, 0, 1, 4, 2)  # [tiles, g, c, j, i]
    weights = packed.reshape(tiles, groups, chunks * 64).to(torch.uint8)
    scale_bytes = half_scales.view(groups, tiles, TILE).permute(1, 0, 2).contiguous().view(torch.uint8)
    zero_bytes = zeros.view(groups, tiles, TILE).permute(1, 0, 2).to(torch.uint8)
    unused = torch.zeros(tiles, groups, PARAMS - 3 * TILE, dtype=torch.uint8)
    data = torch.cat([scale_bytes, zero_bytes, unused, weights], dim=2).reshape(-1).contiguous()
    expected = tiles * build.require().kvdeck_q4_tile_bytes(k, group_size)
    if data.numel() != expected:
        raise AssertionError(f"repacked {data.numel()} bytes, the kernel reads {expected}")
    return Int4Weight(data, n, k, group_size, _Q4Weight(data.data_ptr(), n, k, group_size))


def _pad_columns(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


_GEMM_FUNCTIONS = {torch.bfloat16: "kvdeck_q4_gemm_bf16", torch.float32: "kvdeck_q4_gemm_f32"}


def gemm(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k] (bf16 or fp32, CPU) times the INT4 weight (+ bias [n], x's dtype): [..., n]."""
    library = build.require()
    function = _GEMM_FUNCTIONS.get(x.dtype)
    flat = x.reshape(-1, x.shape[-1])
    if (function is None or flat.shape[-1] != weight.k or flat.stride(-1) != 1 or flat.device.type != "cpu"
            or flat.shape[0] == 0):
        raise ValueError(f"int4 gemm wants bf16 or fp32 CPU rows x [.., {weight.k}] with a contiguous last "
                         f"dim, got {x.dtype} {tuple(x.shape)} on {x.device}")
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (weight.n,) or not bias.is_contiguous()):
        raise ValueError(f"int4 gemm wants a contiguous {x.dtype} bias of shape ({weight.n},)")
    out = torch.empty((flat.shape[0], weight.n), dtype=x.dtype)
    status = getattr(library, function)(
        flat.data_ptr(), flat.shape[0], flat.stride(0), ctypes.byref(weight.struct),
        None if bias is None else bias.data_ptr(), out.data_ptr(), weight.n, None)
    if status != 0:
        raise RuntimeError("the CPU INT4 kernel refused the call (no INT4 path in this build)")
    return out.view(*x.shape[:-1], weight.n)


def dequantize(weight: Int4Weight) -> torch.Tensor:
    """The dense weight [n, k] fp32 the tiles stand for ((q - zero) * scale)."""
    out = torch.empty((weight.n, weight.k), dtype=torch.float32)
    if build.require().kvdeck_q4_dequantize_f32(ctypes.byref(weight.struct), out.data_ptr()) != 0:
        raise RuntimeError("the CPU INT4 dequantisation refused the call")
    return out
