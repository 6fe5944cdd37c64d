"""The CPU INT4 and INT8 kernels (kernels/cpu/int4.c, int8.c) against their torch references:
the repack is lossless, the products equal the int8-activation references within fp32
rounding for every group size, with AutoAWQ's zero points and GPTQ's symmetric form, at
odd widths and any row count, each row independent of the others; and the AVX2 build
(forced on a CPU that has more) computes the same."""

import os
import subprocess
import sys

import pytest
import torch

from kvdeck.kernels.cpu import int4, int8
from kvdeck.kernels.reference.int8_gemm import int8_gemm_q8_torch, quantize_int8_blocks
from kvdeck.kernels.reference.w4a16_gemm import (
    dequantize_awq,
    quantize_activations_q8,
    w4a16_gemm_q8_torch,
    w4a16_gemm_torch,
)
from kvdeck.quant.packing import pack_int4

needs_int4 = pytest.mark.skipif(not int4.available(), reason="no INT4 CPU kernel (x86-64 with AVX2 or VNNI)")
pytestmark = needs_int4


def random_awq(k: int, n: int, group: int, symmetric: bool = False, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    zeros = (torch.full((k // group, n), 8, dtype=torch.int32) if symmetric  # GPTQ's symmetric form
             else torch.randint(0, 16, (k // group, n), generator=gen, dtype=torch.int32))
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).half()
    return pack_int4(q), pack_int4(zeros), scales


def close(out: torch.Tensor, reference: torch.Tensor) -> None:
    """fp32: the order of sums; bf16: one rounding of that (a flip of the last bit)."""
    tolerance = 2e-6 if out.dtype == torch.float32 else 2 ** -7
    scale = reference.float().abs().amax().clamp(min=1e-6)
    assert ((out.float() - reference.float()).abs() / scale).max() <= tolerance


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n", [576, 40, 24])  # SmolLM2's width; not multiples of a 16-column tile
def test_the_repack_is_lossless(group, n):
    qweight, qzeros, scales = random_awq(256, n, group)
    tiles = int4.repack_awq(qweight, qzeros, scales, group)
    assert torch.equal(int4.dequantize(tiles), dequantize_awq(qweight, qzeros, scales.float(), group).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_equals_the_int8_activation_reference(group, symmetric, dtype):
    k, n = 640, 200  # odd tile counts and five groups of 128
    qweight, qzeros, scales = random_awq(k, n, group, symmetric)
    tiles = int4.repack_awq(qweight, qzeros, scales, group)
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(n, generator=gen).to(dtype)
    for rows in (1, 3, 4, 5, 9, 17):
        x = torch.randn(rows, k, generator=gen).to(dtype)
        close(int4.gemm(x, tiles, bias), w4a16_gemm_q8_torch(x, qweight, qzeros, scales, group, bias))
        close(int4.gemm(x, tiles), w4a16_gemm_q8_torch(x, qweight, qzeros, scales, group))


def test_the_activation_quantisation_costs_little():
    """int8 activations per block of 32 against the exact product: about 1% of its scale."""
    qweight, qzeros, scales = random_awq(576, 576, 64)
    x = torch.randn(4, 576)
    exact = w4a16_gemm_torch(x, qweight, qzeros, scales.float(), 64)
    error = (int4.gemm(x, int4.repack_awq(qweight, qzeros, scales, 64)) - exact).abs().max()
    assert error / exact.abs().max() < 0.02


def test_each_row_is_its_own():
    """A row's result does not depend on the rows beside it (a batch, a verify step)."""
    qweight, qzeros, scales = random_awq(256, 96, 64)
    tiles = int4.repack_awq(qweight, qzeros, scales, 64)
    x = torch.randn(7, 256).bfloat16()
    together = int4.gemm(x, tiles)
    for row in range(7):
        assert torch.equal(int4.gemm(x[row:row + 1], tiles), together[row:row + 1])


def test_a_zero_row_gives_the_bias():
    qweight, qzeros, scales = random_awq(64, 16, 32)
    bias = torch.randn(16)
    assert torch.equal(int4.gemm(torch.zeros(2, 64), int4.repack_awq(qweight, qzeros, scales, 32), bias),
                       bias.expand(2, 16))


def test_activations_quantise_as_the_reference_says():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0] * 8])
    x8, block_scales = quantize_activations_q8(x)
    assert block_scales.tolist() == [[pytest.approx(1.0 / 127)]]
    assert x8[0, :4].tolist() == [64.0, -127.0, 32.0, 0.0]  # 63.5 rounds to even


def test_what_cannot_repack_or_run_is_refused():
    qweight, qzeros, scales = random_awq(64, 16, 32)
    with pytest.raises(ValueError, match="group size 16"):
        int4.repack_awq(qweight, torch.zeros(4, 2, dtype=torch.int32), torch.ones(4, 16).half(), 16)
    with pytest.raises(ValueError, match="fp16 does not hold exactly"):
        int4.repack_awq(qweight, qzeros, scales.float() + 1e-7, 32)
    tiles = int4.repack_awq(qweight, qzeros, scales, 32)
    with pytest.raises(ValueError, match=r"x \[\.\., 64\]"):
        int4.gemm(torch.randn(1, 32), tiles)
    with pytest.raises(ValueError, match="bf16 or fp32"):
        int4.gemm(torch.randn(1, 64).half(), tiles)
    with pytest.raises(ValueError, match="bias"):
        int4.gemm(torch.randn(1, 64), tiles, torch.randn(15))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [49, 128])
def test_int8_equals_its_reference(n, dtype):
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(n, 192, generator=gen)
    q, block_scales = quantize_int8_blocks(weight)
    tiles = int8.repack(q, block_scales)
    assert torch.equal(int8.dequantize(tiles), q.float() * block_scales.float().repeat_interleave(32, dim=1))
    for rows in (1, 2, 5):
        x = torch.randn(rows, 192, generator=gen).to(dtype)
        close(int8.gemm(x, tiles), int8_gemm_q8_torch(x, q, block_scales))
    assert (int8.gemm(torch.zeros(1, 192), tiles) == 0).all()
    with pytest.raises(ValueError, match="multiple of 64"):
        int8.from_dense(torch.randn(8, 96))


def test_int8_blocks_quantise_as_llama_cpp_q8_0():
    weight = torch.tensor([[2.54] + [0.01] * 31, [0.0] * 32])
    q, block_scales = quantize_int8_blocks(weight)
    assert block_scales.dtype == torch.float16 and float(block_scales[0, 0]) == pytest.approx(0.02, rel=1e-3)
    assert q[0, 0] == 127 and q[0, 1] == 0 and (q[1] == 0).all()


AVX2_CHECK = """
import torch
from kvdeck.kernels.cpu import build, int4, int8
from kvdeck.kernels.reference.int8_gemm import int8_gemm_q8_torch, quantize_int8_blocks
from kvdeck.kernels.reference.w4a16_gemm import w4a16_gemm_q8_torch
from tests.kernels.test_cpu_int4 import close, random_awq
assert build.int4_isa() == 1 and not build.bf16_path(), (build.int4_isa(), build.bf16_path())
for group in (32, 128):
    qweight, qzeros, scales = random_awq(256, 40, group)
    tiles = int4.repack_awq(qweight, qzeros, scales, group)
    for rows in (1, 5):
        x = torch.randn(rows, 256)
        close(int4.gemm(x, tiles), w4a16_gemm_q8_torch(x, qweight, qzeros, scales, group))
q, s = quantize_int8_blocks(torch.randn(40, 128))
x = torch.randn(3, 128).bfloat16()
close(int8.gemm(x, int8.repack(q, s)), int8_gemm_q8_torch(x, q, s))
print("avx2 ok")
"""


@pytest.mark.skipif("avx512f" not in open("/proc/cpuinfo").read(), reason="the native build is AVX2 already")
def test_the_avx2_build_computes_the_same(tmp_path):
    """KVDECK_CPU_ISA=avx2 builds without AVX-512: the INT4/INT8 kernels take their AVX2 path and
    the bf16 kernels (AVX512-BF16 only) report themselves absent, so those layers fall back."""
    env = dict(os.environ, KVDECK_CPU_ISA="avx2", KVDECK_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), timeout=300)
    assert done.returncode == 0 and "avx2 ok" in done.stdout, done.stderr[-2000:]
