"""The kernel compile counter under the interpreter: it moves when a launch needs a variant
Triton would compile anew (a new dtype, constexpr, int width, 1 or multiple of 16 of a
specialised int, tensor alignment) and not otherwise; the batch-dependent ints (token and
sequence counts, a block table's row stride) never make one."""

import pytest
import torch

from kvdeck.kernels.compile_counter import COMPILES, kernel_compiles
from kvdeck.kernels.triton import launch as launch_module
from kvdeck.kernels.triton.attention import _merge_segments_kernel, paged_attention_triton_impl
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton
from kvdeck.kernels.triton.rmsnorm import rms_norm_triton
from kvdeck.kernels.triton.rope import apply_rope_triton


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test starts as a new process would: no variant launched yet (other tests in this
    session have launched many)."""
    seen, COMPILES.seen = COMPILES.seen, set()
    yield
    COMPILES.seen |= seen


def compiles(call) -> int:
    before = kernel_compiles()
    call()
    return kernel_compiles() - before


def test_row_kernels_compile_once_for_every_batch():
    weight = torch.ones(64)
    assert compiles(lambda: rms_norm_triton(torch.randn(5, 64), weight, 1e-6)) == 1
    for rows in (1, 2, 16, 17, 100, 1024):
        assert compiles(lambda rows=rows: rms_norm_triton(torch.randn(rows, 64), weight, 1e-6)) == 0
    # A new dtype, a residual (a constexpr), a new width (a constexpr): one variant each.
    assert compiles(lambda: rms_norm_triton(torch.randn(3, 64, dtype=torch.float16),
                                            weight.half(), 1e-6)) == 1
    x = torch.randn(3, 64, dtype=torch.float16)
    assert compiles(lambda: rms_norm_triton(x, weight.half(), 1e-6, torch.randn_like(x))) == 1
    assert compiles(lambda: rms_norm_triton(torch.randn(3, 96, dtype=torch.float16),
                                            torch.ones(96, dtype=torch.float16), 1e-6)) == 1


def test_kv_write_and_rope_compile_once_for_every_token_count():
    cache = [torch.zeros(8, 16, 2, 32) for _ in range(2)]
    cos_sin = torch.randn(64, 32)
    compiles(lambda: write_kv_cache_triton(torch.randn(3, 2, 32), torch.randn(3, 2, 32), *cache,
                                           torch.arange(3)))
    compiles(lambda: apply_rope_triton(torch.arange(3), torch.randn(3, 4, 32), torch.randn(3, 2, 32),
                                       cos_sin))
    for tokens in (1, 16, 33):
        key = torch.randn(tokens, 2, 32)
        assert compiles(lambda t=tokens, k=key: write_kv_cache_triton(k, k, *cache, torch.arange(t))) == 0
        assert compiles(lambda t=tokens: apply_rope_triton(torch.arange(t), torch.randn(t, 4, 32),
                                                           torch.randn(t, 2, 32), cos_sin)) == 0


def _decode_step(num_seqs: int, width: int, segments: int = 1, query_len: int = 1):
    """A decode (or, query_len > 1, a prefill) attention launch over `num_seqs` rows whose
    block tables are `width` entries wide (their row stride)."""
    gen = torch.Generator().manual_seed(num_seqs * 100 + width)
    k_cache, v_cache = (torch.randn(64, 16, 2, 32, generator=gen) for _ in range(2))
    tables = torch.randint(0, 64, (num_seqs, width), generator=gen, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), min(width * 16, 40), dtype=torch.int32)
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32) * query_len
    q = torch.randn(num_seqs * query_len, 4, 32, generator=gen)
    return lambda: paged_attention_triton_impl(q, k_cache, v_cache, tables, query_start_loc, seq_lens,
                                               32**-0.5, query_len, 40, num_segments=segments)


def test_attention_compiles_once_for_every_batch_and_table_width():
    assert compiles(_decode_step(3, 5)) == 1
    for num_seqs, width in ((1, 3), (16, 16), (17, 33), (2, 1)):
        assert compiles(_decode_step(num_seqs, width)) == 0
    # A new split count is a new variant of the attention kernel and of the merge.
    assert compiles(_decode_step(2, 4, segments=2)) == 2
    assert compiles(_decode_step(5, 7, segments=2)) == 0
    assert compiles(_decode_step(3, 5, query_len=4)) == 1  # the chunks' launch (decode rows': seen)


def test_an_unspecialised_int_is_the_exception():
    # The merge kernel's ints (an output stride, the head count) are fixed by the model, so
    # they stay specialised: 1, a multiple of 16 and the rest are three variants.
    part = torch.zeros(64, 32)
    stats = torch.zeros(64)

    def merge(num_heads: int):
        out = torch.zeros(1, num_heads, 32)
        return lambda: launch_module.launch(
            _merge_segments_kernel, (1, num_heads), out, part, stats, stats, out.stride(0),
            out.stride(1), num_heads, HEAD_DIM=32, HEAD_DIM_PAD=32, NUM_SEGMENTS=2)

    compiles(merge(3))
    assert compiles(merge(5)) == 0
    assert compiles(merge(1)) == 1  # 1 is a constant to Triton
    assert compiles(merge(16)) == 1  # a multiple of 16 carries its divisibility


def test_tensor_alignment_is_part_of_the_variant():
    weight = torch.ones(40)  # a width no other test uses (40: neither 1 nor a multiple of 16)
    base = torch.randn(4 * 40 + 8)
    compiles(lambda: rms_norm_triton(base[:160].view(4, 40), weight, 1e-6))
    # fp32: an offset of eight elements is 32 bytes (aligned), of one 4 bytes (not).
    assert compiles(lambda: rms_norm_triton(base[8:168].view(4, 40), weight, 1e-6)) == 0
    assert compiles(lambda: rms_norm_triton(base[1:161].view(4, 40), weight, 1e-6)) == 1


def test_specialisation_follows_tritons_rules():
    spec = launch_module._argument
    assert spec(1, True) == ("constexpr", 1) and spec(1, False) == ("i32", False)
    assert spec(32, True) == ("i32", True) and spec(33, True) == ("i32", False)
    assert spec(2**40, True)[0] == "i64" and spec(2.5, True) == ("fp32",) and spec(True, True) == ("u1",)


def test_the_warm_up_covers_every_w4a16_bucket():
    from kvdeck.engine.runner.warmup import W4A16_STEP_TOKENS
    from kvdeck.kernels.triton.w4a16_gemm import FUSED_MAX_TOKENS, M_BUCKETS

    # One token first: the GEMV form a tuned table may serve batch 1 (at most the first bucket).
    assert W4A16_STEP_TOKENS == (1, *(limit for limit, _ in M_BUCKETS), FUSED_MAX_TOKENS + 1)
