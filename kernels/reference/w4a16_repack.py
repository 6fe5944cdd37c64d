"""The CUDA INT4 layout ("repacked"), made once at load from AutoAWQ's tensors, and its torch
reference: the layout the split-K kernel of kernels/triton/w4a16_marlin.py streams.

AutoAWQ packs eight output columns into an int32 (qweight [K, N/8]), so a program's weight
tile is BLOCK_N/8 int32s per row, 64-byte segments, and each int32 must be copied to the
eight columns it feeds before its nibbles are unpacked. Here an int32 packs eight
consecutive *input* rows of one column instead, and the columns come in tiles of TILE_N:

    qweight int32 [N_pad/TILE_N, K/8, TILE_N]: element [t, p, c] holds q[8p + j, t*TILE_N + c]
    at bits ROW_SHIFTS[j] (j = 0..7), so `(packed[:, None, :] >> ROW_SHIFTS[None, :, None]) & 0xF`
    (one shift, one mask) is the [K/8, 8, N] block whose reshape is q[K, N]. The rows are
    interleaved, as Marlin's are: nibbles 0..7 hold rows 0, 2, 4, 6, 1, 3, 5, 7, so the masks
    0x000f000f and 0x00f000f0 (nibbles i and i + 4) pick rows 2m and 2m + 1, the pair a tensor
    core's operand register holds: the lop3 dequantisation (kernels/triton/w4a16_lop3.py) then
    needs no byte permutes to pair them (sm_90's decode loop: 4.59 instructions a weight for
    bf16 where rows j, j + 4 took 5.11, 32 PRMTs of 327);
    zeros   uint8 [K/G, N_pad] (0..15), or None where every zero point is 8 (GPTQ's
    symmetric checkpoints: the kernel then folds the constant in);
    scales  [K/G, N_pad], the checkpoint's dtype.

A column tile is one contiguous strip over the whole of K, so a program walking K reads
consecutive TILE_N*4-byte rows (128-bit loads per thread). N is padded to a whole tile with
zero weights and scales (the kernels mask those columns out). w[k, n] = (q - z) * s, exactly
the AutoAWQ tensors' weight: the repack is lossless (`unpack_repacked` gives them back).

A merged gate | up layer may have its columns *paired* (`pair_halves`): stored column 2j is
gate column j and 2j + 1 is up column j, so every output tile of an even width holds whole
(gate, up) pairs and the kernel's epilogue can apply the MLP's gated activation itself (one
launch fewer a layer; kernels/triton/w4a16_marlin.py). Pairing is a storage detail only: every
function here (`unpack_repacked`, `dequantize_repacked`, the references) gives the columns in
the layer's own order, gate then up, and `unpair_halves` undoes it (a LoRA adapter's delta is
added to the gate | up output before the activation, so such a layer runs unfused).
"""

from dataclasses import dataclass

import torch

from kvdeck.kernels.ops import PACK_FACTOR
from kvdeck.kernels.reference.activation import GATED_ACTIVATIONS
from kvdeck.kernels.reference.w4a16_gemm import unpack_int4

TILE_N = 64
# Bit offset of row j's nibble in its int32: row j sits at nibble j // 2 + 4 * (j % 2).
ROW_SHIFTS = tuple(4 * (j // 2 + 4 * (j % 2)) for j in range(8))  # 0, 16, 4, 20, 8, 24, 12, 28
SYMMETRIC_ZERO = 8  # GPTQ's symmetric zero point (v1 stores 7; AWQ's layout holds the 8)

__all__ = ["ROW_SHIFTS", "SYMMETRIC_ZERO", "TILE_N", "RepackedW4", "dequantize_repacked", "pair_halves",
           "repack_awq", "unpair_halves", "unpack_repacked", "w4a16_gated_repacked_torch",
           "w4a16_gemm_repacked_torch"]


@dataclass(frozen=True, slots=True)
class RepackedW4:
    qweight: torch.Tensor  # int32 [N_pad/TILE_N, K/8, TILE_N]
    zeros: torch.Tensor | None  # uint8 [K/G, N_pad]; None: symmetric (every zero SYMMETRIC_ZERO)
    scales: torch.Tensor  # [K/G, N_pad]
    group_size: int
    k: int
    n: int  # the real output size (N_pad rounds it up to TILE_N)
    paired: bool = False  # columns stored as (gate j, up j) pairs (`pair_halves`)

    @property
    def n_pad(self) -> int:
        return self.scales.shape[1]


def paired_order(n: int, device: torch.device | None = None) -> torch.Tensor:
    """The logical column each stored column of a paired layer holds: 2j -> j (gate),
    2j + 1 -> n/2 + j (up)."""
    half = torch.arange(n // 2, device=device)
    return torch.stack((half, half + n // 2), dim=1).reshape(n)


def _reorder_columns(w: RepackedW4, order: torch.Tensor, paired: bool) -> RepackedW4:
    """`w` with stored column c taken from column order[c] (c < n; the padding stays put)."""
    order = torch.cat((order.to(w.scales.device), torch.arange(w.n, w.n_pad, device=w.scales.device)))
    tiles, packed_k, tile_n = w.qweight.shape
    words = w.qweight.transpose(0, 1).reshape(packed_k, tiles * tile_n)[:, order]
    qweight = words.view(packed_k, tiles, tile_n).transpose(0, 1).contiguous()
    zeros = None if w.zeros is None else w.zeros[:, order].contiguous()
    return RepackedW4(qweight=qweight, zeros=zeros, scales=w.scales[:, order].contiguous(),
                      group_size=w.group_size, k=w.k, n=w.n, paired=paired)


def pair_halves(w: RepackedW4) -> RepackedW4:
    """A gate | up layer's columns stored as (gate j, up j) pairs, for the fused activation."""
    if w.paired:
        return w
    if w.n % 2:
        raise ValueError(f"pairing gate and up columns needs two equal halves, got {w.n} columns")
    return _reorder_columns(w, paired_order(w.n), True)


def unpair_halves(w: RepackedW4) -> RepackedW4:
    """The inverse of `pair_halves`: the columns in the layer's own order again."""
    if not w.paired:
        return w
    return _reorder_columns(w, torch.argsort(paired_order(w.n)), False)


def _pack_rows(q: torch.Tensor) -> torch.Tensor:
    """int32 [K, N] of 0..15 -> int32 [N/TILE_N, K/8, TILE_N], rows 8p..8p+7 in one int32."""
    k, n = q.shape
    shifts = torch.tensor(ROW_SHIFTS, dtype=torch.int32, device=q.device)
    nibbles = q.view(k // PACK_FACTOR, PACK_FACTOR, n) << shifts.view(1, -1, 1)
    packed = nibbles[:, 0]
    for j in range(1, PACK_FACTOR):  # disjoint bits: OR (sum would carry into the sign bit)
        packed = packed | nibbles[:, j]
    return packed.view(k // PACK_FACTOR, n // TILE_N, TILE_N).transpose(0, 1).contiguous()


def _unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `_pack_rows`: int32 [K, N_pad] of 0..15."""
    tiles, packed_k, tile_n = packed.shape
    shifts = torch.tensor(ROW_SHIFTS, dtype=torch.int32, device=packed.device)
    q = (packed.unsqueeze(2) >> shifts.view(1, 1, -1, 1)) & 0xF  # [T, K/8, 8, TILE_N]
    return q.permute(1, 2, 0, 3).reshape(packed_k * PACK_FACTOR, tiles * tile_n)


def _pad_columns(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    if t.shape[1] == n_pad:
        return t.contiguous()
    return torch.nn.functional.pad(t, (0, n_pad - t.shape[1])).contiguous()


def repack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int) -> RepackedW4:
    """AutoAWQ's qweight [K, N/8], qzeros [K/G, N/8] (int32) and scales [K/G, N] -> the
    repacked layout on the same device. K must be a multiple of the group and of 8."""
    k, n = qweight.shape[0], scales.shape[1]
    if k % group_size or group_size % PACK_FACTOR or qweight.shape[1] * PACK_FACTOR != n \
            or qzeros.shape != (k // group_size, n // PACK_FACTOR):
        raise ValueError(f"AWQ tensors do not fit: qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}, group {group_size}")
    n_pad = -(-n // TILE_N) * TILE_N
    q = _pad_columns(unpack_int4(qweight), n_pad)
    z = unpack_int4(qzeros)
    zeros = None if bool((z == SYMMETRIC_ZERO).all()) else _pad_columns(z, n_pad).to(torch.uint8)
    return RepackedW4(qweight=_pack_rows(q), zeros=zeros, scales=_pad_columns(scales, n_pad),
                      group_size=group_size, k=k, n=n)


def unpack_repacked(w: RepackedW4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [K, N], z [K/G, N], scales [K/G, N]): the values the layout holds, padding dropped,
    in the layer's own column order (a paired layer's unpaired)."""
    if w.paired:
        return unpack_repacked(unpair_halves(w))
    q = _unpack_rows(w.qweight)[:, :w.n]
    if w.zeros is None:
        z = torch.full((w.k // w.group_size, w.n), SYMMETRIC_ZERO, dtype=torch.int32,
                       device=q.device)
    else:
        z = w.zeros[:, :w.n].to(torch.int32)
    return q, z, w.scales[:, :w.n]


def dequantize_repacked(w: RepackedW4, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dense weight [K, N]: (q - z) in the scales' dtype times the scale (one rounding),
    as `dequantize_awq` makes it from the AutoAWQ tensors."""
    q, z, scales = unpack_repacked(w)
    groups = w.k // w.group_size
    weight = (q.view(groups, w.group_size, w.n) - z.unsqueeze(1)).to(scales.dtype) * scales.unsqueeze(1)
    return weight.view(w.k, w.n).to(dtype or scales.dtype)


def w4a16_gemm_repacked_torch(x: torch.Tensor, w: RepackedW4,
                              bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x @ dequantize_repacked(w, x.dtype)
    return out if bias is None else out + bias


def w4a16_gated_repacked_torch(x: torch.Tensor, w: RepackedW4, activation: str,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """act(gate) * up of a gate | up layer's product (`activation`: GATED_ACTIVATIONS), [M, N/2]."""
    return GATED_ACTIVATIONS[activation](w4a16_gemm_repacked_torch(x, w, bias))
