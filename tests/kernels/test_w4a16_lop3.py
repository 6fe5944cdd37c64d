"""The lop3 PTX dequantisation (kernels/triton/w4a16_lop3.py) without a GPU: a small emulator
runs the asm text itself, instruction by instruction, on numpy words, and its eight results must
be the reference's q - z for every nibble value in every position and every zero point; the
Triton halves around the asm (the zero-point pairs, the row order of the eight results) run
under the interpreter. The AOT matrix (test_compile_for_gpu.py) proves it lowers for sm_80..90."""

import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import ROW_SHIFTS, TILE_N, RepackedW4, dequantize_repacked
from kvdeck.kernels.triton import w4a16_lop3

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _halves_to_float(bits: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(bits.astype(np.int16)).view(dtype).double().numpy()


def _float_to_halves(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    # float64 -> float32 is exact for these products and sums of 16-bit floats; one rounding follows.
    out = torch.from_numpy(values.astype(np.float32)).to(dtype).view(torch.int16).numpy()
    return out.astype(np.uint32) & 0xFFFF


def _pair_op(op: str, args: list[np.ndarray]) -> np.ndarray:
    dtype = torch.bfloat16 if op.endswith("bf16x2") else torch.float16
    result = np.zeros_like(args[0])
    for shift in (0, 16):
        vals = [_halves_to_float((a >> shift) & 0xFFFF, dtype) for a in args]
        if op.startswith("sub."):
            exact = vals[0] - vals[1]
        elif op.startswith("fma.rn."):
            exact = vals[0] * vals[1] + vals[2]
        elif op.startswith("mul.rn."):
            exact = vals[0] * vals[1]
        else:
            raise AssertionError(f"no emulation for {op}")
        result |= _float_to_halves(exact, dtype) << shift
    return result


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    """PTX lop3: bit i of the result is lut[(a_i << 2) | (b_i << 1) | c_i]."""
    full = np.uint32(0xFFFFFFFF)
    out = np.zeros_like(a)
    for minterm in range(8):
        if lut >> minterm & 1:
            out |= ((a if minterm & 4 else ~a & full) & (b if minterm & 2 else ~b & full)
                    & (c if minterm & 1 else ~c & full))
    return out


def run_asm(asm: str, inputs: dict[int, np.ndarray], outputs: int) -> list[np.ndarray]:
    """Emulate the asm's instructions on uint32 arrays; operand $i for i >= outputs are inputs."""
    regs: dict[str, np.ndarray] = {f"${i}": v.astype(np.uint32) for i, v in inputs.items()}

    def value(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
        return np.uint32(int(token, 0))

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # split a 32-bit pair into two halves
            lo, hi, src = re.fullmatch(r"\{(\S+), (\S+)\}, (\S+)", rest).groups()
            regs[lo], regs[hi] = value(src) & 0xFFFF, value(src) >> 16
            continue
        dst, *args = [t.strip() for t in rest.split(",")]
        if op == "mov.b32":
            regs[dst] = np.broadcast_to(value(args[0]), next(iter(inputs.values())).shape).astype(np.uint32)
        elif op == "lop3.b32":
            regs[dst] = _lop3(value(args[0]), value(args[1]), value(args[2]), int(args[3], 0))
        elif op == "shr.u32":
            regs[dst] = value(args[0]) >> np.uint32(int(args[1], 0))
        elif op == "shl.b32":
            regs[dst] = (value(args[0]).astype(np.uint64) << np.uint64(int(args[1], 0))).astype(np.uint32)
        elif op == "and.b32":
            regs[dst] = value(args[0]) & value(args[1])
        elif op == "cvt.f32.f16":  # a 16-bit register's fp16 -> fp32 bits (exact)
            regs[dst] = _halves_to_float(value(args[0]), torch.float16).astype(np.float32).view(np.uint32)
        elif op == "add.f32":  # one fp32 rounding
            regs[dst] = (value(args[0]).view(np.float32) + value(args[1]).view(np.float32)).view(np.uint32)
        else:
            regs[dst] = _pair_op(op, [value(a) for a in args])
    return [regs[f"${i}"] for i in range(outputs)]


def _zero_pairs_numpy(z: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The asm's zero-point operands from the Triton helper itself, under the interpreter."""
    z_t = torch.from_numpy(z.astype(np.int32))
    lo, hi = torch.empty_like(z_t), torch.empty_like(z_t)
    _zero_pairs_kernel[(1,)](z_t, lo, hi, DTYPE=triton.language.float16 if name == "fp16"
                             else triton.language.bfloat16, N=z_t.numel())
    return lo.numpy().view(np.uint32), hi.numpy().view(np.uint32)


@triton.jit
def _zero_pairs_kernel(z_ptr, lo_ptr, hi_ptr, DTYPE: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, N)
    lo, hi = w4a16_lop3.zero_pairs(tl.load(z_ptr + offs), DTYPE)
    tl.store(lo_ptr + offs, lo)
    tl.store(hi_ptr + offs, hi)


def _every_nibble_and_zero(name: str, seed: int, random_words: int):
    """(words, zero points, lo, hi) as [word, zero point] grids: every value in every position
    (all eight nibbles v), then random words, against every zero point 0..15 and its pairs."""
    gen = np.random.default_rng(seed)
    words = np.concatenate([np.arange(16, dtype=np.uint64) * 0x11111111,
                            gen.integers(0, 2**32, random_words, dtype=np.uint64)]).astype(np.uint32)
    z = np.arange(16, dtype=np.uint32)
    lo, hi = _zero_pairs_numpy(z, name)
    w_grid, lo_grid = np.meshgrid(words, lo, indexing="ij")
    return w_grid, z, lo_grid, np.broadcast_to(hi[None, :], w_grid.shape)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_asm_gives_q_minus_z_for_every_nibble_and_zero_point(name):
    dtype = DTYPES[name]
    asm = w4a16_lop3.FP16_ASM if name == "fp16" else w4a16_lop3.BF16_ASM
    w_grid, z, lo_grid, hi_grid = _every_nibble_and_zero(name, 0, 240)
    rows = run_asm(asm, {8: w_grid, 9: lo_grid, 10: hi_grid}, outputs=8)
    for j, bits in enumerate(rows):
        q = (w_grid >> np.uint32(ROW_SHIFTS[j])) & 0xF
        expected = q.astype(np.float64) - z[None, :].astype(np.float64)
        got = _halves_to_float(bits, dtype)
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} row {j}")


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_asm_times_scale_is_the_reference_weight(name):
    # What the kernel does with the asm's result: one multiply by the column's scale in the
    # scales' dtype, bit for bit the reference's dense weight (dequantize_repacked).
    dtype = DTYPES[name]
    asm = w4a16_lop3.FP16_ASM if name == "fp16" else w4a16_lop3.BF16_ASM
    gen = np.random.default_rng(1)
    words = gen.integers(0, 2**32, (16, TILE_N), dtype=np.uint64).astype(np.uint32)  # K = 128
    z = gen.integers(0, 16, TILE_N).astype(np.uint32)
    scales = (torch.rand(1, TILE_N, generator=torch.Generator().manual_seed(2)) * 0.02 + 0.001).to(dtype)
    lo, hi = _zero_pairs_numpy(z, name)
    rows = run_asm(asm, {8: words, 9: np.broadcast_to(lo, words.shape),
                         10: np.broadcast_to(hi, words.shape)}, 8)
    diff = torch.stack([torch.from_numpy(bits.astype(np.int16)).view(dtype) for bits in rows], 1)
    got = diff.reshape(words.shape[0] * 8, TILE_N) * scales
    layer = RepackedW4(qweight=torch.from_numpy(words.view(np.int32))[None],
                       zeros=torch.from_numpy(z.astype(np.uint8))[None], scales=scales,
                       group_size=words.shape[0] * 8, k=words.shape[0] * 8, n=TILE_N)
    assert torch.equal(got.view(torch.int16), dequantize_repacked(layer).view(torch.int16))


@triton.jit
def _rows_kernel(out_ptr, P: tl.constexpr, N: tl.constexpr):
    p = tl.arange(0, P)[:, None]
    n = tl.arange(0, N)[None, :]
    base = p * 1000 + n  # r_j[p, n] = 1000p + n + 100000j: the value names its row and column
    rows = w4a16_lop3.rows_in_order(base, base + 100000, base + 200000, base + 300000,
                                    base + 400000, base + 500000, base + 600000, base + 700000)
    tl.store(out_ptr + tl.arange(0, P * 8)[:, None] * N + n, rows)


def test_rows_come_back_in_k_order():
    p, n = 4, 16
    out = torch.empty((p * 8, n), dtype=torch.int32)
    _rows_kernel[(1,)](out, P=p, N=n)
    k = torch.arange(p * 8)[:, None]
    expected = (k // 8) * 1000 + torch.arange(n)[None, :] + (k % 8) * 100000
    assert torch.equal(out, expected.to(torch.int32))


def _rounded(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(values).to(dtype).double().numpy()


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_dot_asm_sums_a_words_eight_products_as_documented(name):
    # The GEMV form's PTX (w4a16_lop3.FP16_DOT_ASM / BF16_DOT_ASM): rows 2m, 2m + 1 of the word
    # times the activation pair m, each product and each running sum of the four pairs rounded
    # once to the 16-bit type (the first a product alone, then fused multiply-adds), the two
    # halves' sums added in fp32. Emulated instruction by instruction on every nibble in every
    # position and every zero point, against that arithmetic done here independently.
    dtype = DTYPES[name]
    asm = w4a16_lop3.FP16_DOT_ASM if name == "fp16" else w4a16_lop3.BF16_DOT_ASM
    w_grid, z, lo_grid, hi_grid = _every_nibble_and_zero(name, 3, 112)
    x = torch.randn((*w_grid.shape, 8), generator=torch.Generator().manual_seed(4)).to(dtype)
    x_bits = x.view(torch.int16).numpy().astype(np.uint32) & 0xFFFF
    pairs = {4 + m: x_bits[..., 2 * m] | (x_bits[..., 2 * m + 1] << 16) for m in range(4)}
    (got,) = run_asm(asm, {1: w_grid, 2: lo_grid, 3: hi_grid, **pairs}, outputs=1)
    got = got.view(np.float32).astype(np.float64)

    q_minus_z = np.stack([((w_grid >> np.uint32(ROW_SHIFTS[j])) & 0xF).astype(np.float64) - z[None, :]
                          for j in range(8)], axis=-1)
    xs = x.double().numpy()
    halves = []
    for half in (0, 1):  # rows 2m (the low halves) and 2m + 1 (the high)
        running = _rounded(q_minus_z[..., half] * xs[..., half], dtype)
        for m in range(1, 4):
            running = _rounded(q_minus_z[..., 2 * m + half] * xs[..., 2 * m + half] + running, dtype)
        halves.append(running)
    expected = (halves[0].astype(np.float32) + halves[1].astype(np.float32)).astype(np.float64)
    np.testing.assert_array_equal(got, expected)
    # And close to the exact dot product: a 16-bit rounding or two of its size.
    exact = (q_minus_z * xs).sum(axis=-1)
    scale = np.abs(q_minus_z * xs).sum(axis=-1) + 1e-3
    assert np.max(np.abs(got - exact) / scale) < (8e-3 if name == "fp16" else 3e-2)
