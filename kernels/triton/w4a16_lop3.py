"""INT4 -> fp16/bf16 dequantisation in inline PTX, as Marlin's `dequant` does it, for the
repacked kernel (kernels/triton/w4a16_marlin.py) on CUDA. Never under the interpreter, which
runs no asm: there the plain-Triton magic-number path serves (the kernel's LOP3 constexpr).

One asm instance takes one packed int32 (rows 8p..8p+7 of one column, interleaved: nibbles
0..7 hold rows 0, 2, 4, 6, 1, 3, 5, 7, kernels/reference/w4a16_repack.py's ROW_SHIFTS) and the
column's zero-point pairs, and returns the eight values q_j - z exactly (|q - z| <= 15), each
32-bit result holding rows 2m and 2m + 1 as a tensor core's operand register pairs them:
- fp16: lop3 (q & 0x000f000f) | 0x64006400 makes two fp16s 1024 + q (nibbles i and i + 4,
  bits 0 and 16: rows 0 and 1); with mask 0x00f000f0 they are 1024 + 16q (rows 2, 3). One
  sub.f16x2 (minus the pair 1024 + z) and one fma.rn.f16x2 (times 1/16, minus the pair 64 + z)
  finish two rows each; a shift by 8 repeats it for rows 4-7: 4 lop3, 1 shift, 2 sub, 2 fma
  for eight weights.
- bf16: its 7 mantissa bits hold no 16q, so each nibble pair (rows 0-1, 2-3, 4-5, 6-7) is
  shifted down (0, 4, 8, 12) and lop3'd with 0x43004300 (128 + q); fma.rn.bf16x2 (times 1.0,
  plus -(128 + z)) subtracts (sm_80 has fma.bf16x2, not sub.bf16x2).
Results come back as int16 bit patterns (the "h" registers), bitcast in Triton.

FP16_ASM and BF16_ASM are plain strings so tests/kernels/test_w4a16_lop3.py can emulate the
exact instructions on CPU against the reference dequantisation.
"""

import triton
import triton.language as tl

# $0..$7: rows 0..7 of the word (int16 bits; $2m and $2m+1 from one 32-bit register, which
# the compiler keeps whole); $8: the packed word; $9, $10: zero-point pairs.
FP16_ASM = """{
.reg .b32 q, a, b, sixteenth;
mov.b32 sixteenth, 0x2c002c00;
lop3.b32 a, $8, 0x000f000f, 0x64006400, 0xea;
lop3.b32 b, $8, 0x00f000f0, 0x64006400, 0xea;
sub.f16x2 a, a, $9;
fma.rn.f16x2 b, b, sixteenth, $10;
mov.b32 {$0, $1}, a;
mov.b32 {$2, $3}, b;
shr.u32 q, $8, 8;
lop3.b32 a, q, 0x000f000f, 0x64006400, 0xea;
lop3.b32 b, q, 0x00f000f0, 0x64006400, 0xea;
sub.f16x2 a, a, $9;
fma.rn.f16x2 b, b, sixteenth, $10;
mov.b32 {$4, $5}, a;
mov.b32 {$6, $7}, b;
}"""

BF16_ASM = """{
.reg .b32 q, a, one;
mov.b32 one, 0x3f803f80;
lop3.b32 a, $8, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $9;
mov.b32 {$0, $1}, a;
shr.u32 q, $8, 4;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $9;
mov.b32 {$2, $3}, a;
shr.u32 q, $8, 8;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $9;
mov.b32 {$4, $5}, a;
shr.u32 q, $8, 12;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $9;
mov.b32 {$6, $7}, a;
}"""

CONSTRAINTS = "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r"

# The decode-size GEMV (kernels/triton/w4a16_gemv.py): one word's eight q - z (as above) times
# the eight activations of its rows, summed: $0 the fp32 sum; $1 the packed word; $2, $3 the
# zero-point pairs; $4..$7 the activation pairs (rows 2m, 2m + 1 as one 32-bit register, as
# two consecutive 16-bit activations load). The products and the sums of four pairs are
# 16-bit (mul/fma .f16x2 or .bf16x2, each rounding once), the two halves' sum fp32.
FP16_DOT_ASM = """{
.reg .b32 q, a, b, acc, sixteenth;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
mov.b32 sixteenth, 0x2c002c00;
lop3.b32 a, $1, 0x000f000f, 0x64006400, 0xea;
lop3.b32 b, $1, 0x00f000f0, 0x64006400, 0xea;
sub.f16x2 a, a, $2;
fma.rn.f16x2 b, b, sixteenth, $3;
mul.rn.f16x2 acc, a, $4;
fma.rn.f16x2 acc, b, $5, acc;
shr.u32 q, $1, 8;
lop3.b32 a, q, 0x000f000f, 0x64006400, 0xea;
lop3.b32 b, q, 0x00f000f0, 0x64006400, 0xea;
sub.f16x2 a, a, $2;
fma.rn.f16x2 b, b, sixteenth, $3;
fma.rn.f16x2 acc, a, $6, acc;
fma.rn.f16x2 acc, b, $7, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}"""

# bf16: sm_80 has no mul.bf16x2, so the first product is an fma plus -0.0 (exact); a bf16
# half is the top of an fp32, so the halves widen by a shift and a mask.
BF16_DOT_ASM = """{
.reg .b32 q, a, acc, one, negzero, flo, fhi;
mov.b32 one, 0x3f803f80;
mov.b32 negzero, 0x80008000;
lop3.b32 a, $1, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $2;
fma.rn.bf16x2 acc, a, $4, negzero;
shr.u32 q, $1, 4;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $2;
fma.rn.bf16x2 acc, a, $5, acc;
shr.u32 q, $1, 8;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $2;
fma.rn.bf16x2 acc, a, $6, acc;
shr.u32 q, $1, 12;
lop3.b32 a, q, 0x000f000f, 0x43004300, 0xea;
fma.rn.bf16x2 a, a, one, $2;
fma.rn.bf16x2 acc, a, $7, acc;
shl.b32 flo, acc, 16;
and.b32 fhi, acc, 0xffff0000;
add.f32 $0, flo, fhi;
}"""

DOT_CONSTRAINTS = "=f,r,r,r,r,r,r,r"

_FP16_ASM = tl.constexpr(FP16_ASM)
_BF16_ASM = tl.constexpr(BF16_ASM)
_CONSTRAINTS = tl.constexpr(CONSTRAINTS)
_FP16_DOT_ASM = tl.constexpr(FP16_DOT_ASM)
_BF16_DOT_ASM = tl.constexpr(BF16_DOT_ASM)
_DOT_CONSTRAINTS = tl.constexpr(DOT_CONSTRAINTS)


@triton.jit
def zero_pairs(z, DTYPE: tl.constexpr):
    """Per column z (int32, 0..15) -> the asm's two operand pairs (int32, both halves equal):
    fp16 (1024 + z, -(64 + z)); bf16 (-(128 + z), unused)."""
    if DTYPE == tl.float16:
        lo = 0x6400 | z  # 1024 + z: the fp16 unit at 1024 is 1
        hi = 0xD400 | (z << 4)  # -(64 + z): the unit at 64 is 1/16
    else:
        lo = 0xC300 | z  # -(128 + z) in bf16: the unit at 128 is 1
        hi = lo
    return (lo << 16) | lo, (hi << 16) | hi


@triton.jit
def dequant_lop3(packed, z, DTYPE: tl.constexpr):
    """packed int32 [P, N] (row 8p + j at bits ROW_SHIFTS[j]) and the columns' zero points z int32 [N]
    -> q - z as DTYPE (fp16 or bf16) [8P, N], exact."""
    P: tl.constexpr = packed.shape[0]
    N: tl.constexpr = packed.shape[1]
    lo, hi = zero_pairs(z, DTYPE)
    lo = tl.broadcast_to(lo[None, :], (P, N))
    hi = tl.broadcast_to(hi[None, :], (P, N))
    if DTYPE == tl.float16:
        r0, r1, r2, r3, r4, r5, r6, r7 = tl.inline_asm_elementwise(
            _FP16_ASM, _CONSTRAINTS, [packed, lo, hi], dtype=(tl.int16,) * 8, is_pure=True, pack=1)
    else:
        r0, r1, r2, r3, r4, r5, r6, r7 = tl.inline_asm_elementwise(
            _BF16_ASM, _CONSTRAINTS, [packed, lo, hi], dtype=(tl.int16,) * 8, is_pure=True, pack=1)
    return rows_in_order(r0, r1, r2, r3, r4, r5, r6, r7).to(DTYPE, bitcast=True)


@triton.jit
def rows_in_order(r0, r1, r2, r3, r4, r5, r6, r7):
    """Eight [P, N] tensors (row j of each word) -> [8P, N], row 8p + j from r_j[p]."""
    P: tl.constexpr = r0.shape[0]
    N: tl.constexpr = r0.shape[1]
    # join puts its pair on a new last axis, so nesting three deep gives [P, N, 2, 2, 2] whose
    # index (i, j, k) flattens to 4i + 2j + k, i choosing in the innermost joins, k the outermost.
    rows = tl.join(tl.join(tl.join(r0, r4), tl.join(r2, r6)), tl.join(tl.join(r1, r5), tl.join(r3, r7)))
    rows = tl.permute(tl.reshape(rows, (P, N, 8)), (0, 2, 1))
    return tl.reshape(rows, (P * 8, N))


@triton.jit
def dot_word_lop3(packed, lo, hi, x0, x1, x2, x3, DTYPE: tl.constexpr):
    """sum_j (q_j - z) * x_j over each packed word's eight rows, fp32, by the inline PTX above:
    packed int32, the zero pairs lo/hi (`zero_pairs`) and the activation pairs x0..x3 (int32,
    rows 2m and 2m + 1 of the word), all broadcast to one shape."""
    if DTYPE == tl.float16:
        return tl.inline_asm_elementwise(_FP16_DOT_ASM, _DOT_CONSTRAINTS, [packed, lo, hi, x0, x1, x2, x3],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_BF16_DOT_ASM, _DOT_CONSTRAINTS, [packed, lo, hi, x0, x1, x2, x3],
                                         dtype=tl.float32, is_pure=True, pack=1)
