"""The CPU GEMV kernels (kernels/cpu/native.c, bf16; cpu_native_f32.c, fp32): their arithmetic,
their checks, their build, and the linear layers' use of them for steps of few rows."""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

from kvdeck.kernels.cpu import build
from kvdeck.kernels.cpu import native as cpu_native

needs_kernel = pytest.mark.skipif(not cpu_native.available(),
                                  reason="needs an x86 CPU with AVX512-BF16 and a C compiler")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.float() @ weight.float().t()
    return out + bias.float() if bias is not None else out


def assert_bf16_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Within bf16 rounding of the fp32 result (the kernel sums in fp32, in its own order)."""
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    scale = ref.abs().amax(dim=-1, keepdim=True).clamp(min=1.0)
    assert ((out.float() - ref).abs() / scale).max().item() < 2 ** -7


@needs_kernel
@pytest.mark.parametrize("n_len,k_len", [(1, 1), (7, 40), (33, 64), (100, 33), (960, 576), (576, 1536),
                                         (4096, 256)])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 17])
def test_matches_fp32_matmul_for_any_shape_and_row_count(n_len, k_len, rows):
    generator = torch.Generator().manual_seed(n_len * 1000 + k_len + rows)
    x = torch.randn(rows, k_len, generator=generator).bfloat16()
    weight = torch.randn(n_len, k_len, generator=generator).bfloat16()
    bias = torch.randn(n_len, generator=generator).bfloat16()
    assert_bf16_close(cpu_native.bf16_gemv(x, weight, bias), reference(x, weight, bias))
    assert_bf16_close(cpu_native.bf16_gemv(x, weight), reference(x, weight, None))


@needs_kernel
@pytest.mark.parametrize("n_len,k_len", [(1, 1), (7, 40), (33, 64), (100, 33), (96, 48), (4096, 256)])
@pytest.mark.parametrize("rows", [1, 2, 4, 9])
def test_the_fp32_gemv_is_the_fp64_product_to_fp32_rounding(n_len, k_len, rows):
    generator = torch.Generator().manual_seed(n_len * 1000 + k_len + rows)
    x = torch.randn(rows, k_len, generator=generator)
    weight = torch.randn(n_len, k_len, generator=generator)
    bias = torch.randn(n_len, generator=generator)
    exact = x.double() @ weight.double().t()
    for got, want in [(cpu_native.f32_gemv(x, weight, bias), exact + bias.double()),
                      (cpu_native.f32_gemv(x, weight), exact)]:
        assert got.dtype == torch.float32
        # a sum of k fp32 products: within a few k ulps of the magnitudes summed
        bound = 4 * k_len * 2 ** -24 * (x.abs().double() @ weight.abs().double().t() + 1)
        assert ((got.double() - want).abs() <= bound).all()
    # each row sums in the same order whatever the row count: a token alone or in a step
    assert torch.equal(cpu_native.f32_gemv(x[-1:], weight), cpu_native.f32_gemv(x, weight)[-1:])
    with pytest.raises(ValueError, match="f32_gemv wants fp32 CPU tensors"):
        cpu_native.f32_gemv(x.bfloat16(), weight)


@needs_kernel
def test_an_fp32_output_head_takes_the_gemv_for_few_rows(monkeypatch):
    from kvdeck.engine.runner.models.linear import SmallBatchOutputHead, UnquantizedLinearMethod

    lm_head = torch.nn.Linear(64, 300, bias=False)
    monkeypatch.setattr(cpu_native, "last_level_cache_bytes", lambda: 1 << 20)
    head = UnquantizedLinearMethod().output_head(lm_head)
    assert isinstance(head, SmallBatchOutputHead) and head.weight is lm_head.weight  # tied stays tied
    assert head.max_rows == cpu_native.F32_CACHED_MAX_ROWS  # 77 KB of weight: in the cache
    monkeypatch.setattr(cpu_native, "last_level_cache_bytes", lambda: 1 << 16)
    head = UnquantizedLinearMethod().output_head(lm_head)
    assert head.max_rows == cpu_native.F32_GEMV_MAX_ROWS  # past it: one pass of the GEMV
    calls = []
    gemv = cpu_native.f32_gemv
    monkeypatch.setattr(cpu_native, "f32_gemv", lambda x, w: calls.append(x.shape[0]) or gemv(x, w))
    most = cpu_native.F32_GEMV_MAX_ROWS
    hidden = torch.randn(most + 1, 64)
    with torch.no_grad():
        for rows in (1, most, most + 1):
            torch.testing.assert_close(head(hidden[:rows]), lm_head(hidden[:rows]), rtol=1e-5, atol=1e-5)
    assert calls == [1, most]  # more rows: torch's matmul
    bf16_head = UnquantizedLinearMethod().output_head(torch.nn.Linear(64, 300, bias=False).bfloat16())
    assert not isinstance(bf16_head, SmallBatchOutputHead)  # bf16 has its packed head


@needs_kernel
def test_reads_strided_rows_and_keeps_leading_dims():
    """A slice of a wider activation (the q part of a merged qkv) is read in place."""
    wide = torch.randn(3, 2, 100).bfloat16()
    x = wide[..., 10:74]  # row stride 100, not 64
    weight = torch.randn(48, 64).bfloat16()
    out = cpu_native.bf16_gemv(x, weight)
    assert out.shape == (3, 2, 48)
    assert_bf16_close(out, reference(x, weight, None))


@needs_kernel
def test_rounds_to_nearest_even_and_keeps_nan_and_inf():
    x = torch.zeros(2, 32)
    x[0, :2] = torch.tensor([1.0, 2.0 ** -8])
    x[1, 2] = float("inf")
    weight = torch.zeros(4, 32)
    weight[0, :2] = torch.tensor([1.0, 1.0])  # 1 + 2^-8: halfway, to the even 1.0
    weight[1, :2] = torch.tensor([1.0, 3.0])  # 1 + 3 * 2^-8: halfway, to the even 1 + 2^-6
    weight[2, 2] = 1.0  # inf
    weight[3, 2] = -1.0  # -inf
    out = cpu_native.bf16_gemv(x.bfloat16(), weight.bfloat16()).float()
    assert out[0, :2].tolist() == [1.0, 1.0 + 2.0 ** -6]
    assert out[1, 2:].tolist() == [float("inf"), float("-inf")]
    x[0, 0] = float("nan")
    assert torch.isnan(cpu_native.bf16_gemv(x.bfloat16(), weight.bfloat16())[0, :2]).all()


@needs_kernel
def test_refuses_inputs_it_cannot_read_and_names_them():
    weight = torch.randn(8, 32).bfloat16()
    with pytest.raises(ValueError, match="bf16 CPU tensors"):
        cpu_native.bf16_gemv(torch.randn(1, 32), weight)  # fp32 activations
    with pytest.raises(ValueError, match="bf16 CPU tensors"):
        cpu_native.bf16_gemv(torch.randn(1, 31).bfloat16(), weight)  # wrong K
    with pytest.raises(ValueError, match="bf16 CPU tensors"):
        cpu_native.bf16_gemv(torch.randn(1, 32).bfloat16(), torch.randn(32, 8).bfloat16().t())
    with pytest.raises(ValueError, match="bias"):
        cpu_native.bf16_gemv(torch.randn(1, 32).bfloat16(), weight, torch.randn(9).bfloat16())


@needs_kernel
def test_builds_once_into_the_cache_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path))
    built = build.built_library()
    assert built.parent == tmp_path / "cache" / "kernels"
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no partial file left
    stamp = built.stat().st_mtime_ns
    assert build.built_library() == built and built.stat().st_mtime_ns == stamp


def test_the_cache_needs_no_platformdirs(tmp_path, monkeypatch):
    """The GPU image has no platformdirs, and an fp32 CPU model asks for the build too."""
    monkeypatch.delenv("KVDECK_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # importing it raises ImportError
    assert build.cache_dir() == tmp_path / "kvdeck" / "kernels"


def test_a_failed_build_leaves_no_file_and_the_layers_keep_onednn(tmp_path, monkeypatch):
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path))
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(build, "SOURCES", [broken, *build.SOURCES[1:]])
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    build.library.cache_clear()
    try:
        assert build.library() is None
        kernels = tmp_path / "cache" / "kernels"
        assert not kernels.exists() or list(kernels.iterdir()) == []
    finally:
        build.library.cache_clear()


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("KVDECK_CPU_NATIVE", "0")
    build.library.cache_clear()
    try:
        assert not cpu_native.available()
        assert not cpu_native.worth_a_second_copy(1)
    finally:
        monkeypatch.delenv("KVDECK_CPU_NATIVE")
        build.library.cache_clear()


@needs_kernel
def test_a_second_copy_only_for_weights_that_fit_easily():
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert cpu_native.worth_a_second_copy(10 << 20)
    assert not cpu_native.worth_a_second_copy(memory // 4)


@needs_kernel
def test_linear_layer_takes_the_kernel_for_few_rows_and_onednn_for_more(monkeypatch):
    from kvdeck.engine.runner.models.linear import Linear, UnquantizedLinearMethod
    from kvdeck.kernels.cpu.linear import bf16_packing_supported

    if not bf16_packing_supported():
        pytest.skip("needs oneDNN bf16")
    method = UnquantizedLinearMethod()
    method.small_batch_gemv = True
    layer = Linear(64, [48, 16], bias=True, method=method, dtype=torch.bfloat16)
    weight, bias = torch.randn(64, 64).bfloat16(), torch.randn(64).bfloat16()
    layer.load_weight("weight", weight[:48], 0)
    layer.load_weight("weight", weight[48:], 1)
    layer.load_weight("bias", bias[:48], 0)
    layer.load_weight("bias", bias[48:], 1)
    method.process_weights_after_loading(layer)
    assert layer.weight.is_mkldnn and torch.equal(layer.dense_weight, weight)
    calls = []
    real = cpu_native.bf16_gemv
    monkeypatch.setattr(cpu_native, "bf16_gemv", lambda *a: calls.append(a[0].shape) or real(*a))
    for rows in (1, cpu_native.GEMV_MAX_ROWS, cpu_native.GEMV_MAX_ROWS + 1, 16):
        x = torch.randn(rows, 64).bfloat16()
        assert_bf16_close(layer(x), reference(x, weight, bias))
    assert calls == [(1, 64), (cpu_native.GEMV_MAX_ROWS, 64)]


@needs_kernel
def test_under_torch_compile_it_is_one_opaque_op():
    weight = torch.randn(40, 64).bfloat16()
    x = torch.randn(1, 64).bfloat16()

    def project(x):
        return F.silu(cpu_native.small_batch_linear(x, weight, None)) * 2

    torch._dynamo.reset()
    compiled = torch.compile(project, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), project(x))


def paged_case(lens: list[int], heads: int, kv_heads: int, dim: int, block_size: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    num_blocks = sum((n + block_size - 1) // block_size for n in lens) + 4
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator).bfloat16()
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=generator).bfloat16()
    width = max((n + block_size - 1) // block_size for n in lens)
    order = torch.randperm(num_blocks, generator=generator)
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for row, n in enumerate(lens):  # each row its own shuffled blocks, as the block manager gives
        count = (n + block_size - 1) // block_size
        tables[row, :count] = order[used:used + count].int()
        used += count
    # q as the model makes it: a slice of the merged qkv projection, rows strided
    qkv = torch.randn(len(lens), (heads + 2 * kv_heads) * dim, generator=generator).bfloat16()
    q = qkv[:, : heads * dim].view(len(lens), heads, dim)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@needs_kernel
@pytest.mark.parametrize("lens,heads,kv_heads,dim,window,soft_cap", [
    ([192], 9, 3, 64, 0, 0.0),  # SmolLM2's shape, one chat
    ([1, 17, 100, 33], 4, 2, 64, 0, 0.0),  # rows of every length, block edges
    ([40, 3], 8, 8, 80, 0, 0.0),  # no GQA, a head dim that is not a multiple of 16 lanes x 2
    ([300, 64], 8, 2, 128, 50, 0.0),  # sliding window shorter and longer than the context
    ([70], 4, 1, 256, 0, 30.0),  # Gemma 2's soft cap, multi-query
])
def test_decode_attention_matches_the_fp32_reference_closer_than_torch_bf16(lens, heads, kv_heads, dim,
                                                                           window, soft_cap):
    from kvdeck.kernels.reference.attention import paged_attention_torch

    q, k_cache, v_cache, tables, seq_lens = paged_case(lens, heads, kv_heads, dim)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    args = (tables, starts, seq_lens, dim ** -0.5, 1, max(lens), window, soft_cap)
    exact = paged_attention_torch(q.float(), k_cache.float(), v_cache.float(), *args)
    torch_bf16 = paged_attention_torch(q, k_cache, v_cache, *args)
    native = cpu_native.decode_attention(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5, window, soft_cap)
    assert native.dtype == torch.bfloat16 and native.shape == q.shape
    native_error = (native.float() - exact).abs().max().item()
    assert native_error <= 2 ** -7 * exact.abs().max().item()
    assert native_error <= (torch_bf16.float() - exact).abs().max().item() + 1e-6


@needs_kernel
@pytest.mark.parametrize("lens,heads,kv_heads,dim,window,soft_cap", [
    ([192, 5], 4, 2, 64, 0, 0.0),  # the demo's shape: groups of two 64-dim heads (a compiled instance)
    ([1, 17, 100, 33], 9, 3, 64, 0, 0.0),  # SmolLM2's groups of three (runtime counts), block edges
    ([40, 3], 8, 8, 80, 0, 0.0),  # no GQA, a head dim that is not a multiple of 16 lanes
    ([300, 64], 8, 1, 128, 50, 0.0),  # a group of eight (two walks of four), windows short and long
    ([70], 6, 2, 128, 0, 30.0),  # groups of three at 128 dims, Gemma 2's soft cap
    ([16, 32, 15], 4, 4, 256, 0, 0.0),  # whole tiles only, one head a group, 256 dims
])
def test_fp32_decode_attention_is_the_fp32_reference_up_to_the_order_of_its_sums(lens, heads, kv_heads, dim,
                                                                                 window, soft_cap):
    """The decoder stack's fp32 attention (each key and value read once for a group of heads,
    sixteen scores summed across lanes at once) against the torch path in fp32."""
    from kvdeck.kernels.reference.attention import paged_attention_torch

    q, k_cache, v_cache, tables, seq_lens = paged_case(lens, heads, kv_heads, dim, seed=1)
    q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    args = (tables, starts, seq_lens, dim ** -0.5, 1, max(lens), window, soft_cap)
    want = paged_attention_torch(q, k_cache, v_cache, *args)
    got = cpu_native.decode_attention(q, k_cache, v_cache, tables, seq_lens, dim ** -0.5, window, soft_cap)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * want.abs().max().item())
    alone = cpu_native.decode_attention(q[-1:], k_cache, v_cache, tables[-1:], seq_lens[-1:], dim ** -0.5,
                                        window, soft_cap)
    assert torch.equal(alone[0], got[-1])  # a row's result does not depend on the others
    k_half, v_half = k_cache.half(), v_cache.half()  # an fp16 cache: the same, widened as read
    args = (tables, seq_lens, dim ** -0.5, window, soft_cap)
    over_half = cpu_native.decode_attention(q, k_half, v_half, *args)
    assert torch.equal(over_half, cpu_native.decode_attention(q, k_half.float(), v_half.float(), *args))
    with pytest.raises(ValueError, match="all bf16, all fp32, or fp32 q over fp16"):
        cpu_native.decode_attention(q, k_cache.bfloat16(), v_cache, tables, seq_lens, 0.125)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 64), (8, 1, 128), (6, 2, 80)])
def test_a_heads_attention_does_not_depend_on_the_tile_it_shares(heads, kv_heads, dim):
    """Tiles take whole groups of heads (a kv head's keys widened once for all of them) and
    a head's arithmetic is its own: one kv group alone gives its heads the same bits."""
    q, k_cache, v_cache, tables, seq_lens = paged_case([1, 37, 300], heads, kv_heads, dim, seed=2)
    scale = dim ** -0.5
    whole = cpu_native.decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    group = heads // kv_heads
    for g in range(kv_heads):
        heads_of_g = slice(g * group, (g + 1) * group)
        k_of_g, v_of_g = k_cache[:, :, g:g + 1].contiguous(), v_cache[:, :, g:g + 1].contiguous()
        alone = cpu_native.decode_attention(q[:, heads_of_g].contiguous(), k_of_g, v_of_g, tables, seq_lens,
                                            scale)
        assert torch.equal(alone, whole[:, heads_of_g])


@needs_kernel
def test_decode_attention_refuses_layouts_it_cannot_read():
    q, k_cache, v_cache, tables, seq_lens = paged_case([20], 4, 2, 64)
    with pytest.raises(ValueError, match="kv heads divide"):
        cpu_native.decode_attention(q[:, :3], k_cache, v_cache, tables, seq_lens, 0.125)
    with pytest.raises(ValueError, match="contiguous caches"):
        cpu_native.decode_attention(q, k_cache.transpose(1, 2), v_cache, tables, seq_lens, 0.125)
    with pytest.raises(ValueError, match="a length per row"):
        cpu_native.decode_attention(q, k_cache, v_cache, tables, seq_lens.repeat(2), 0.125)


@needs_kernel
def test_the_torch_backend_sends_bf16_decode_steps_to_the_native_kernel(monkeypatch):
    from kvdeck.kernels.dispatch import TORCH_OPS

    calls = []
    real = cpu_native.decode_attention
    monkeypatch.setattr(cpu_native, "decode_attention", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    q, k_cache, v_cache, tables, seq_lens = paged_case([20, 5], 4, 2, 64)
    starts = torch.arange(3, dtype=torch.int32)
    TORCH_OPS.paged_attention(q, k_cache, v_cache, tables, starts, seq_lens, 0.125, 1, 20)
    assert calls == [2]
    TORCH_OPS.paged_attention(q.float(), k_cache.float(), v_cache.float(), tables, starts, seq_lens,
                              0.125, 1, 20)  # fp32: the exact torch path
    prefill_q = torch.randn(4, 4, 64).bfloat16()  # a chunk of 3 query tokens and one decode row
    TORCH_OPS.paged_attention(prefill_q, k_cache, v_cache, tables, torch.tensor([0, 3, 4], dtype=torch.int32),
                              seq_lens, 0.125, 3, 20)
    assert calls == [2]


@needs_kernel
@pytest.mark.parametrize("rows,n", [(1, 576), (5, 100), (64, 2048), (3, 15)])
def test_rms_norm_rounds_as_the_torch_path(rows, n):
    """One pass per row, rounding where `rms_norm_torch` rounds: the same bf16 values
    (only the fp32 sum's order differs, which these inputs do not reach)."""
    from kvdeck.kernels.reference.rmsnorm import rms_norm_torch

    generator = torch.Generator().manual_seed(rows * n)
    x = (torch.randn(rows, n, generator=generator) * 3).bfloat16()
    residual = torch.randn(rows, n, generator=generator).bfloat16()
    weight = torch.randn(n, generator=generator).bfloat16()
    assert torch.equal(cpu_native.rms_norm(x, weight, 1e-5), rms_norm_torch(x, weight, 1e-5))
    normed, summed = cpu_native.rms_norm(x, weight, 1e-5, residual)
    expected_normed, expected_summed = rms_norm_torch(x, weight, 1e-5, residual)
    assert torch.equal(summed, expected_summed)
    assert torch.equal(normed, expected_normed)


@needs_kernel
@pytest.mark.parametrize("rows,d", [(1, 1536), (7, 40), (16, 768)])
def test_silu_and_mul_rounds_as_the_torch_path(rows, d):
    from kvdeck.kernels.reference.activation import silu_and_mul_torch

    x = (torch.randn(rows, 2 * d, generator=torch.Generator().manual_seed(d)) * 6).bfloat16()
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp's clamps, and zeros
    assert torch.equal(cpu_native.silu_and_mul(x), silu_and_mul_torch(x))


@needs_kernel
@pytest.mark.parametrize("rotary_dim", [64, 32])  # full and partial rotary
def test_rope_on_q_and_k_views_equals_the_torch_path(rotary_dim):
    from kvdeck.kernels.reference.rope import apply_rope_torch, build_cos_sin_cache

    cache = build_cos_sin_cache(1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)), 512)
    qkv = torch.randn(5, (9 + 2 * 3) * 64, generator=torch.Generator().manual_seed(rotary_dim)).bfloat16()
    q, k = qkv[:, :576].view(5, 9, 64), qkv[:, 576:768].view(5, 3, 64)  # views, as the layer has them
    positions = torch.tensor([0, 5, 100, 511, 3])
    q_native, k_native = cpu_native.apply_rope_neox(positions, q, k, cache)
    q_torch, k_torch = apply_rope_torch(positions, q, k, cache, True)
    assert torch.equal(q_native, q_torch) and torch.equal(k_native, k_torch)


@needs_kernel
def test_element_wise_kernels_refuse_what_they_cannot_read():
    with pytest.raises(ValueError, match="weight of shape"):
        cpu_native.rms_norm(torch.randn(2, 8).bfloat16(), torch.randn(9).bfloat16(), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        cpu_native.rms_norm(torch.randn(2, 8).bfloat16(), torch.randn(8).bfloat16(), 1e-5,
                            torch.randn(3, 8).bfloat16())
    with pytest.raises(ValueError, match="gate | up"):
        cpu_native.silu_and_mul(torch.randn(2, 7).bfloat16())
    with pytest.raises(ValueError, match="bf16 CPU rows"):
        cpu_native.silu_and_mul(torch.randn(2, 8))
    q = torch.randn(2, 4, 16).bfloat16()
    with pytest.raises(ValueError, match="position per token"):
        cpu_native.apply_rope_neox(torch.tensor([0]), q, q, torch.zeros(8, 16))


@needs_kernel
def test_the_torch_backend_takes_the_native_element_wise_kernels_for_bf16_only(monkeypatch):
    from kvdeck.kernels.dispatch import TORCH_OPS

    calls = []
    for name in ("rms_norm", "silu_and_mul", "apply_rope_neox"):
        real = getattr(cpu_native, name)
        monkeypatch.setattr(cpu_native, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a))
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(3, 64).to(dtype)
        TORCH_OPS.rms_norm(x, torch.ones(64, dtype=dtype), 1e-5, x)
        TORCH_OPS.silu_and_mul(x)
        q = torch.randn(3, 4, 16).to(dtype)
        TORCH_OPS.apply_rope(torch.arange(3), q, q[:, :2], torch.zeros(8, 16))
        TORCH_OPS.apply_rope(torch.arange(3), q, q[:, :2], torch.zeros(8, 16), False)  # GPT-J form: torch
    assert calls == ["rms_norm", "silu_and_mul", "apply_rope_neox"]
