"""The CUDA INT4 layout (kernels/reference/w4a16_repack.py) and its kernel (kernels/triton/
w4a16_marlin.py): the repack is lossless, and the kernel (under TRITON_INTERPRET=1 on CPU,
set by tests/conftest.py before triton loads) matches dequantise-then-matmul for every M
bucket, group size, AWQ zero points and GPTQ's symmetric ones, with and without act-order."""

import os
from dataclasses import replace

import pytest
import torch

from kvdeck.engine.runner.models.linear import Linear, get_linear_method
from kvdeck.kernels import dispatch
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq, unpack_int4
from kvdeck.kernels.reference.w4a16_repack import (
    ROW_SHIFTS,
    TILE_N,
    dequantize_repacked,
    repack_awq,
    unpack_repacked,
    w4a16_gemm_repacked_torch,
)
from kvdeck.quant.gptq_linear import to_awq
from kvdeck.quant.packing import pack_int4

GROUP_SIZES = (32, 64, 128)
TOKENS = (1, 4, 16, 64)  # the decode buckets' sizes (and one past the smallest)


def _random_awq(k: int, n: int, group: int, dtype: torch.dtype, seed: int, symmetric: bool = False):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), generator=gen, dtype=torch.int32)
    if symmetric:  # GPTQ sym as to_awq leaves it: every zero point 8
        qzeros = pack_int4(torch.full((k // group, n), 8, dtype=torch.int32))
    else:
        qzeros = torch.randint(-(2**31), 2**31 - 1, (k // group, n // 8), generator=gen,
                               dtype=torch.int32)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(dtype)
    return qweight, qzeros, scales


def _assert_matches(out, x, dense, bias=None):
    expected = x.double() @ dense.double()
    if bias is not None:
        expected += bias.double()
    assert out.dtype == x.dtype and out.shape == expected.shape
    tol = 1e-4 if x.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", GROUP_SIZES)
def test_repack_round_trip_is_lossless(group, symmetric):
    k, n = 4 * group, 200  # n pads to a whole TILE_N
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float16, group, symmetric)
    repacked = repack_awq(qweight, qzeros, scales, group)
    assert repacked.qweight.shape == (-(-n // TILE_N), k // 8, TILE_N)
    assert (repacked.zeros is None) == symmetric
    q, z, s = unpack_repacked(repacked)
    assert torch.equal(q, unpack_int4(qweight)) and torch.equal(z, unpack_int4(qzeros))
    assert torch.equal(s, scales)
    assert torch.equal(pack_int4(q), qweight) and torch.equal(pack_int4(z), qzeros)
    assert torch.equal(dequantize_repacked(repacked), dequantize_awq(qweight, qzeros, scales, group))
    # Padded columns hold nothing (zero weights, zero scales).
    assert not repacked.scales[:, n:].any()


def test_one_shift_and_mask_unpack_a_block():
    # The layout's promise to the kernel: int32 [t, p, c] holds row 8p + j of column
    # t * TILE_N + c at bits ROW_SHIFTS[j], rows interleaved so nibbles i and i + 4 (the lop3
    # masks' pairs) are rows 2m and 2m + 1, a tensor core operand register's pair.
    assert ROW_SHIFTS == (0, 16, 4, 20, 8, 24, 12, 28)
    qweight, qzeros, scales = _random_awq(64, 128, 32, torch.float32, 9)
    q = unpack_int4(qweight)
    packed = repack_awq(qweight, qzeros, scales, 32).qweight
    block = (packed[1, 3][None, :] >> torch.tensor(ROW_SHIFTS, dtype=torch.int32)[:, None]) & 0xF
    assert torch.equal(block, q[24:32, TILE_N:2 * TILE_N])
    nibbles = (packed[1, 3][None, :] >> (4 * torch.arange(8, dtype=torch.int32))[:, None]) & 0xF
    assert torch.equal(nibbles, q[24:32, TILE_N:2 * TILE_N][[0, 2, 4, 6, 1, 3, 5, 7]])


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", TOKENS)
def test_kernel_matches_dequantise_then_matmul(marlin, m, group, symmetric):
    k, n = 2 * group, 136
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float16, m + group, symmetric)
    repacked = repack_awq(qweight, qzeros, scales, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half()
    bias = torch.randn(n).half()
    out = marlin.w4a16_gemm_marlin(x, repacked, bias)
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, group), bias)


@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", TOKENS)
def test_gpu_configs_split_k_match_the_reference(marlin, m, group):
    # The interpreter is one "SM" and never splits by default: run each bucket's config as
    # an H100 would pick it, the split-K reduction included (fp32: the interpreter's exact path).
    k, n = 8 * group, 200
    config = marlin.choose_config(m, n, k, group, num_sms=132)
    assert config.split_k > 1 and group % config.block_k == 0
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, m * group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(group))
    out = marlin.w4a16_matmul_marlin(x, repack_awq(qweight, qzeros, scales, group), config=config)
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, group))


@pytest.mark.parametrize("symmetric", [False, True])
def test_broadcast_load_unpacking_matches(marlin, symmetric):
    qweight, qzeros, scales = _random_awq(256, 136, 64, torch.float16, 11, symmetric)
    x = torch.randn(5, 256).half()
    out = marlin.w4a16_matmul_marlin(x, repack_awq(qweight, qzeros, scales, 64),
                                     config=marlin.BROADCAST_CONFIG)
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, 64))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("m", [1, 5, 16, 23])
def test_swapped_product_matches(marlin, m, symmetric):
    # out^T = W^T x^T (MarlinConfig.swap_ab): the weights as the MMA's M side; token counts
    # below, at and past one 16-row tile, split-K (each program's transposed tile summed).
    qweight, qzeros, scales = _random_awq(512, 200, 64, torch.float32, m, symmetric)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    config = replace(marlin.SWAP_CONFIG, block_k=64, split_k=4)
    out = marlin.w4a16_matmul_marlin(x, repack_awq(qweight, qzeros, scales, 64), config=config)
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, 64))
    assert marlin.SWAP_CONFIG.swap_ab and not marlin.M_BUCKETS[0][1].swap_ab


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_form_matches(marlin, m, group, symmetric, dtype):
    # The GEMV form (kernels/triton/w4a16_gemv.py, no tensor cores, one row a program): every
    # group, AWQ and GPTQ's symmetric zeros, a bias, N past a whole column tile, split-K.
    k, n = 4 * group, 200
    qweight, qzeros, scales = _random_awq(k, n, group, dtype, m * group, symmetric)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    bias = torch.randn(n).to(dtype)
    repacked = repack_awq(qweight, qzeros, scales, group)
    for split in (1, 4):
        config = replace(marlin.GEMV_CONFIG, block_n=64, block_k=min(64, group), split_k=split)
        out = marlin.w4a16_matmul_marlin(x, repacked, bias, config=config)
        _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, group), bias)


def test_gemv_form_takes_activations_at_any_offset_and_stride(marlin):
    # Its activation pairs load as int32 on CUDA: a view that starts mid-pair or strides
    # oddly is copied first, the same product either way.
    qweight, qzeros, scales = _random_awq(128, 64, 64, torch.float32, 9)
    repacked = repack_awq(qweight, qzeros, scales, 64)
    base = torch.randn(3, 129)
    x = base[:, 1:]  # offset by one element, row stride 129
    config = replace(marlin.GEMV_CONFIG, block_n=64, block_k=64, split_k=2)
    out = marlin.w4a16_matmul_marlin(x, repacked, config=config)
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, 64))
    assert torch.equal(out, marlin.w4a16_matmul_marlin(x.contiguous(), repacked, config=config))
    with pytest.raises(ValueError, match="not a GEMV-form config"):
        from kvdeck.kernels.triton.w4a16_gemv import w4a16_matmul_gemv

        w4a16_matmul_gemv(x, repacked, None, replace(config, block_m=16), lop3=False)
    with pytest.raises(ValueError, match="activations in the scales' dtype"):
        w4a16_matmul_gemv(x.half(), repacked, None, config, lop3=True)


def test_tuned_gemv_serves_the_smallest_batches_only(marlin):
    from kvdeck.kernels.triton import w4a16_marlin_plan as plan

    fields = {f: getattr(plan.GEMV_CONFIG, f) for f in plan.CONFIG_FIELDS}
    tuned = plan.tuning_from_table({"gemv_max_tokens": 2, "gemv": {**fields, "block_n": 256}})
    for m in (1, 2):
        config = plan._fitted_config(m, 4096, 4096, 128, 132, tuned)
        assert config.gemv and config.block_n == 256 and config.block_m == 1
    assert not plan._fitted_config(3, 4096, 4096, 128, 132, tuned).gemv
    assert not plan._fitted_config(1, 4096, 4096, 128, 132, plan.DEFAULT_TUNING).gemv  # off untuned
    with pytest.raises(ValueError, match="gemv_max_tokens 17"):
        plan.tuning_from_table({"gemv_max_tokens": 17})
    with pytest.raises(ValueError, match="the GEMV form"):
        plan.tuning_from_table({"gemv_max_tokens": 1, "gemv": {**fields, "gemv": False}})


def test_split_k_is_deterministic_and_resets_its_counters(marlin):
    qweight, qzeros, scales = _random_awq(512, 64, 64, torch.float32, 3)
    repacked = repack_awq(qweight, qzeros, scales, 64)
    x = torch.randn(5, 512)
    config = marlin.MarlinConfig(block_m=16, block_n=32, block_k=32, split_k=4, num_warps=4,
                                 num_stages=1)
    first = marlin.w4a16_matmul_marlin(x, repacked, config=config)
    assert not marlin._split_counters.get(x.device, 2).any()
    assert torch.equal(first, marlin.w4a16_matmul_marlin(x, repacked, config=config))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("symmetric", [False, True])
def test_device_dequantise_is_the_reference_weight(marlin, dtype, symmetric):
    qweight, qzeros, scales = _random_awq(96, 136, 32, dtype, 4, symmetric)
    dense = marlin.dequantize_marlin(repack_awq(qweight, qzeros, scales, 32))
    assert torch.equal(dense, dequantize_awq(qweight, qzeros, scales, 32))


def test_large_m_dequantises_then_multiplies(marlin):
    m = marlin.FUSED_MAX_TOKENS + 1
    qweight, qzeros, scales = _random_awq(64, 72, 32, torch.float32, 5)
    x = torch.randn(m, 64)
    out = marlin.w4a16_gemm_marlin(x, repack_awq(qweight, qzeros, scales, 32))
    _assert_matches(out, x, dequantize_awq(qweight, qzeros, scales, 32))


def test_batch_sizes_share_one_compiled_variant(marlin):
    from kvdeck.kernels.compile_counter import COMPILES
    from kvdeck.kernels.triton.w4a16_gemm import M_BUCKETS

    # The engine's warm-up runs the AWQ kernel's bucket limits; this kernel's are the same.
    assert [limit for limit, _ in marlin.M_BUCKETS] == [limit for limit, _ in M_BUCKETS]
    qweight, qzeros, scales = _random_awq(64, 64, 32, torch.float32, 6)
    repacked = repack_awq(qweight, qzeros, scales, 32)
    marlin.w4a16_matmul_marlin(torch.randn(1, 64), repacked)
    before = COMPILES.by_kernel["_w4a16_marlin_kernel"]
    for m in (2, 3, 5, 16):
        marlin.w4a16_matmul_marlin(torch.randn(m, 64), repacked)
    assert COMPILES.by_kernel["_w4a16_marlin_kernel"] == before


def test_split_count_fills_whole_waves(marlin):
    # Llama-3-8B's 4096 x 4096 at M = 1 on 132 SMs: 64 column tiles, 32 K tiles of 128.
    slots = 132 * marlin.PROGRAMS_PER_SM
    split = marlin.choose_split(64, 32, 16, slots)
    cost = lambda s: -(-64 * s // slots) * -(-32 // s)  # noqa: E731
    assert all(cost(split) <= cost(s) for s in range(1, 17))
    assert marlin.choose_split(64, 32, 16, 2) == 1  # one SM: nothing to fill
    assert marlin.choose_split(4, 3, 16, slots) == 1  # too few K tiles to split


def _gptq_sym_layer_tensors(k: int, n: int, group: int, act_order: bool, seed: int):
    """GPTQ v1 symmetric tensors written independently (zeros stored as 7) and their weight."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int64)
    order = torch.randperm(k, generator=gen) if act_order else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).half()
    dense = (q - 8).half() * scales[g_idx.long()]  # [k, n]
    qweight = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        qweight |= q[j::8] << (4 * j)
    qzeros = torch.zeros(k // group, n // 8, dtype=torch.int64)
    for j in range(8):
        qzeros |= 7 << (4 * j)
    as_int32 = lambda t: torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)  # noqa: E731
    return as_int32(qweight), as_int32(qzeros), scales, g_idx, dense


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_symmetric_goes_through_the_permutation_and_the_kernel(marlin, act_order):
    k, n, group = 256, 72, 64
    qweight, qzeros, scales, g_idx, dense = _gptq_sym_layer_tensors(k, n, group, act_order, 7)
    awq_q, awq_z, awq_s, permutation = to_awq(qweight, qzeros, scales, g_idx, group)
    repacked = repack_awq(awq_q, awq_z, awq_s, group)
    assert repacked.zeros is None and (permutation is None) == (not act_order)
    x = torch.randn(4, k).half()
    permuted = x if permutation is None else x.index_select(-1, permutation)
    _assert_matches(marlin.w4a16_gemm_marlin(permuted, repacked), x, dense)


def test_kernel_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("KVDECK_W4A16_KERNEL", raising=False)
    # the H200 run chose it (benchmarks/results/w4a16_h200.json: 0.99x bf16 at decode, the
    # AutoAWQ-layout kernel 0.53x)
    assert dispatch.w4a16_kernel() == dispatch.W4A16_AUTO == "marlin"
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "Marlin")
    assert dispatch.w4a16_kernel() == "marlin"
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "fast")
    with pytest.raises(ValueError, match="KVDECK_W4A16_KERNEL"):
        dispatch.w4a16_kernel()


@pytest.mark.parametrize("quant", ["awq", "gptq"])
def test_linear_layers_repack_when_the_kernel_is_chosen(marlin, monkeypatch, quant):
    # backend "triton" on a CPU repacks as CUDA does (the kernel under the interpreter); the
    # CPU's own path ("auto") is left alone.
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
    k, n, group = 128, 64, 32
    if quant == "awq":
        qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, 8)
        tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
        dense = dequantize_awq(qweight, qzeros, scales, group)
        config = {"bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    else:
        qweight, qzeros, scales, g_idx, dense = _gptq_sym_layer_tensors(k, n, group, True, 8)
        tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales.float(), "g_idx": g_idx}
        dense = dense.float()
        config = {"bits": 4, "group_size": group, "desc_act": True, "sym": True}
    method = get_linear_method(quant, {**config, "w4a16_backend": "triton"})
    layer = Linear(k, [n], False, method, torch.float32)
    for name, tensor in tensors.items():
        layer.load_weight(name, tensor, 0)
    layer.method.process_weights_after_loading(layer)
    assert layer.repacked is not None and layer.qweight.dim() == 3
    assert (layer.repacked.zeros is None) == (quant == "gptq")
    x = torch.randn(3, k)
    _assert_matches(layer(x), x, dense)
    permuted = x if quant == "awq" else x.index_select(-1, layer.input_permutation)
    torch.testing.assert_close(w4a16_gemm_repacked_torch(permuted, layer.repacked), x @ dense.float(),
                               rtol=1e-3, atol=1e-3)  # fp32 sums in another order
    cpu_layer = Linear(k, [n], False, get_linear_method(quant, config), torch.float32)
    for name, tensor in tensors.items():
        cpu_layer.load_weight(name, tensor, 0)
    cpu_layer.method.process_weights_after_loading(cpu_layer)
    assert cpu_layer.repacked is None


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="CUDA graphs need a GPU and compiled kernels (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [False, True])
def test_cuda_graphs_capture_every_decode_bucket(marlin, dtype, symmetric):
    from kvdeck.engine.runner.decode_graphs import MAX_CAPTURED_BATCH, decode_bucket_sizes

    qweight, qzeros, scales = _random_awq(1024, 512, 64, dtype, 8, symmetric)
    repacked = repack_awq(qweight.cuda(), qzeros.cuda(), scales.cuda(), 64)
    dense = dequantize_awq(qweight, qzeros, scales, 64).cuda()
    for m in decode_bucket_sizes(MAX_CAPTURED_BATCH):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        eager = marlin.w4a16_gemm_marlin(x, repacked)  # compiles outside the capture
        _assert_matches(eager, x, dense)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = marlin.w4a16_gemm_marlin(x, repacked)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(captured, marlin.w4a16_gemm_marlin(x, repacked))
        assert not torch.equal(captured, eager)
