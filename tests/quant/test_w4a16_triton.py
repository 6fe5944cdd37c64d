"""The Triton W4A16 path against dequantise-then-matmul, on every M bucket and group size
(TRITON_INTERPRET=1 on CPU, set by tests/conftest.py before triton loads)."""

import os

import pytest
import torch

from kvdeck.kernels.dispatch import w4a16_gemm
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq, w4a16_gemm_torch
from tests.quant.awq_reference import reference_dequantize

needs_triton_here = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernel needs a GPU or TRITON_INTERPRET=1",
)
needs_compiled_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="CUDA graphs need a GPU and compiled kernels (TRITON_INTERPRET=0)",
)

# One M per bucket of w4a16_gemm_triton.M_BUCKETS (1-16, 17-32, 33-64, 65-256) and one past
# FUSED_MAX_TOKENS (device-side dequantise + matmul); N is not a multiple of the 128 tile.
BUCKET_TOKENS = (1, 16, 27, 50, 200, 300)
GROUP_SIZES = (32, 64, 128)


@pytest.fixture(scope="module")
def w4a16():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernel needs a GPU or TRITON_INTERPRET=1")
    from kvdeck.kernels.triton import w4a16_gemm as w4a16_gemm_triton

    return w4a16_gemm_triton


def _random_awq(k: int, n: int, group: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), generator=gen, dtype=torch.int32)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (k // group, n // 8), generator=gen,
                           dtype=torch.int32)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(dtype)
    return qweight, qzeros, scales


def _assert_matches_reference(out, x, qweight, qzeros, scales, group, bias=None):
    expected = x.double() @ reference_dequantize(qweight, qzeros, scales, group)
    if bias is not None:
        expected += bias.double()
    assert out.dtype == x.dtype and out.shape == expected.shape
    tol = 1e-4 if x.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * 10)


def test_torch_reference_matches_independent_dequantiser():
    qweight, qzeros, scales = _random_awq(256, 64, 128, torch.float32, 0)
    x = torch.randn(3, 256, dtype=torch.float64)
    expected = x @ reference_dequantize(qweight, qzeros, scales, 128)
    out = w4a16_gemm_torch(x.float(), qweight, qzeros, scales, 128)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_dequantise_builds_no_tensor_from_host_data(monkeypatch):
    # torch.tensor(list, device=cuda) is a synchronous copy per call that CUDA graph capture
    # refuses (AWQ batches above FUSED_MAX_TOKENS used to take it on every layer).
    def refuse(*args, **kwargs):
        raise AssertionError("host data copied into a tensor")

    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch, "as_tensor", refuse)
    qweight, qzeros, scales = _random_awq(128, 32, 64, torch.float32, 1)
    assert dequantize_awq(qweight, qzeros, scales, 64).shape == (128, 32)


@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", BUCKET_TOKENS)
def test_engine_path_matches_reference_per_bucket(w4a16, m, group):
    # What the engine runs: the fused GEMM up to FUSED_MAX_TOKENS, dequantise + matmul above.
    k, n = 4 * group, 136
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float16, seed=m + group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half()
    bias = torch.randn(n).half()
    out = w4a16.w4a16_gemm_triton(x, qweight, qzeros, scales, group, bias)
    _assert_matches_reference(out, x, qweight, qzeros, scales, group, bias)


@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", BUCKET_TOKENS[:-1])
def test_gpu_configs_with_split_k_match_reference(w4a16, m, group):
    # The interpreter has one "SM", so it never splits by default; run each bucket's GPU
    # config as an H100 (132 SMs) would, split-K reduction included.
    k, n = 8 * group, 200
    config = w4a16.choose_config(m, n, k, group, num_sms=132)
    assert config.split_k > 1 and group % config.block_k == 0
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, seed=m * group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(group))
    bias = torch.randn(n)
    out = w4a16.w4a16_matmul_triton(x, qweight, qzeros, scales, group, bias, config=config)
    _assert_matches_reference(out, x, qweight, qzeros, scales, group, bias)


def test_split_k_is_deterministic_and_resets_its_counters(w4a16):
    qweight, qzeros, scales = _random_awq(512, 64, 64, torch.float32, 3)
    x = torch.randn(5, 512)
    config = w4a16.W4A16Config(block_m=16, block_n=32, block_k=32, split_k=4, num_warps=4,
                               num_stages=1)
    first = w4a16.w4a16_matmul_triton(x, qweight, qzeros, scales, 64, config=config)
    counters = w4a16._split_counters.get(x.device, 2)
    assert not counters.any()  # every tile's counter is back at 0 for the next launch
    again = w4a16.w4a16_matmul_triton(x, qweight, qzeros, scales, 64, config=config)
    assert torch.equal(first, again)  # partials summed in split order, not arrival order
    _assert_matches_reference(first, x, qweight, qzeros, scales, 64)


def test_choose_config_buckets(w4a16):
    # Decode splits K until about two programs per SM; prefill tiles grow with M; block_k
    # always divides the group; a split keeps at least MIN_K_TILES_PER_SPLIT tiles.
    decode = w4a16.choose_config(1, 4096, 4096, 128, num_sms=132)
    assert (decode.block_m, decode.split_k) == (16, 8)
    assert w4a16.choose_config(16, 4096, 4096, 128, num_sms=132).block_m == 16
    assert w4a16.choose_config(17, 4096, 4096, 128, num_sms=132).block_m == 32
    assert w4a16.choose_config(256, 4096, 4096, 128, num_sms=132).block_m == 128
    assert w4a16.choose_config(1, 576, 576, 64, num_sms=132).split_k == 3  # SmolLM2-135M
    assert w4a16.choose_config(1, 4096, 4096, 32, num_sms=132).block_k == 32
    assert w4a16.choose_config(1, 4096, 128, 128, num_sms=132).split_k == 1
    assert w4a16.choose_config(8, 4096, 4096, 128, num_sms=1).split_k == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_device_dequantise_is_the_reference_weight(w4a16, dtype):
    qweight, qzeros, scales = _random_awq(96, 136, 32, dtype, 4)
    dense = w4a16.awq_dequantize_triton(qweight, qzeros, scales, 32)
    assert torch.equal(dense, dequantize_awq(qweight, qzeros, scales, 32))


def test_reads_strided_input(w4a16):
    qweight, qzeros, scales = _random_awq(128, 64, 64, torch.float32, 5)
    wide = torch.randn(4, 256)
    x = wide[:, ::2]  # non-contiguous rows
    out = w4a16.w4a16_gemm_triton(x, qweight, qzeros, scales, 64)
    torch.testing.assert_close(out, w4a16_gemm_torch(x, qweight, qzeros, scales, 64),
                               rtol=1e-4, atol=1e-4)


@needs_triton_here
def test_triton_backend_dispatches_to_the_kernel():
    qweight, qzeros, scales = _random_awq(128, 32, 128, torch.float32, 6)
    x = torch.randn(2, 128)
    out = w4a16_gemm(x, qweight, qzeros, scales, 128, backend="triton")
    torch.testing.assert_close(out, w4a16_gemm_torch(x, qweight, qzeros, scales, 128),
                               rtol=1e-4, atol=1e-4)


def test_dispatch_uses_reference_on_cpu_and_rejects_unknown_backend():
    qweight, qzeros, scales = _random_awq(128, 32, 128, torch.float32, 6)
    x = torch.randn(2, 128)
    torch.testing.assert_close(w4a16_gemm(x, qweight, qzeros, scales, 128),
                               w4a16_gemm_torch(x, qweight, qzeros, scales, 128))
    with pytest.raises(ValueError, match="backend"):
        w4a16_gemm(x, qweight, qzeros, scales, 128, backend="cuda")


def test_triton_wrapper_rejects_mismatched_shapes(w4a16):
    qweight, qzeros, scales = _random_awq(128, 32, 128, torch.float32, 7)
    with pytest.raises(ValueError, match="do not match"):
        w4a16.w4a16_gemm_triton(torch.randn(2, 256), qweight, qzeros, scales, 128)


@needs_compiled_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_graphs_capture_every_decode_bucket(dtype):
    # Every decode bucket the engine captures (engine/decode_graphs.py), through the path
    # the engine runs, replayed against an eager call.
    from kvdeck.engine.runner.decode_graphs import MAX_CAPTURED_BATCH, decode_bucket_sizes

    qweight, qzeros, scales = (t.cuda() for t in _random_awq(1024, 512, 64, dtype, 8))
    for m in decode_bucket_sizes(MAX_CAPTURED_BATCH):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        eager = w4a16_gemm(x, qweight, qzeros, scales, 64)  # compiles outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = w4a16_gemm(x, qweight, qzeros, scales, 64)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(captured, w4a16_gemm(x, qweight, qzeros, scales, 64))
        assert not torch.equal(captured, eager)  # the replay computed on the new input
