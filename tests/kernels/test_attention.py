"""Triton paged attention vs the torch reference, through the CPU interpreter."""

import pytest
import torch

from kvdeck.kernels.reference.attention import paged_attention_torch
from kvdeck.kernels.triton import attention_tuning
from kvdeck.kernels.triton.attention import paged_attention_triton, paged_attention_triton_impl
from kvdeck.kernels.triton.attention_tuning import AttentionConfig, choose_num_segments
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_matches_reference(batch, out: torch.Tensor) -> None:
    # The reference runs in fp32 on the same (rounded) inputs: the kernel accumulates in fp32.
    expected = paged_attention_torch(*batch.as_fp32())
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    tol = TOLERANCE[batch.q.dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


# (query_lens, seq_lens): decode rows (q=1) mixed with prefill (q == seq) and extend rows
# (q < seq), contexts ending on, before and after block boundaries.
MIXED = ([1, 7, 1, 19, 3], [33, 7, 16, 19, 40])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("gqa", [1, 4, 8])
def test_mixed_decode_prefill_batch(paged_batch, gqa, block_size, dtype):
    num_kv_heads = 2 if gqa < 8 else 1
    batch = paged_batch(*MIXED, num_heads=gqa * num_kv_heads, num_kv_heads=num_kv_heads,
                        head_dim=64, block_size=block_size, dtype=dtype)
    assert_matches_reference(batch, paged_attention_triton(*batch.args()))


@pytest.mark.parametrize(
    "head_dim, dtype", [(80, torch.float16), (96, torch.float32), (128, torch.float16),
                        (64, torch.bfloat16), (80, torch.bfloat16)]
)
def test_head_dims_and_bf16(paged_batch, head_dim, dtype):
    # 80 and 96 are padded to 128 lanes inside the kernel and masked.
    batch = paged_batch(*MIXED, num_heads=6, num_kv_heads=2, head_dim=head_dim, block_size=16,
                        dtype=dtype, seed=head_dim)
    assert_matches_reference(batch, paged_attention_triton(*batch.args()))


@pytest.mark.parametrize("config_name", ["DECODE_CONFIG", "PREFILL_CONFIG",
                                         "PREFILL_CONFIG_SMALL_HEAD"])
def test_gpu_tile_configs(paged_batch, config_name):
    # The interpreter defaults to its own big tiles; the configs a GPU runs must agree too.
    batch = paged_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=96, block_size=16,
                        dtype=torch.float16, seed=5)
    config = getattr(attention_tuning, config_name)
    assert_matches_reference(batch, paged_attention_triton_impl(*batch.args(), config=config))


def test_shared_prefix_blocks_and_extend(paged_batch):
    # Three sequences share their first two cached blocks (prefix-cache hits) and extend
    # with chunks of different lengths; one of them is a plain decode.
    batch = paged_batch([5, 1, 12], [37, 40, 44], num_heads=8, num_kv_heads=2, head_dim=64,
                        block_size=16, dtype=torch.float16, shared_prefix_blocks=2)
    assert (batch.block_tables[:, :2] == batch.block_tables[0, :2]).all()
    assert_matches_reference(batch, paged_attention_triton(*batch.args()))


def test_many_query_blocks_and_tiles_per_sequence(paged_batch):
    # A small tile config makes one long chunk span several q blocks and KV tiles, and puts
    # a zero-length (padding) sequence in the middle of the batch.
    batch = paged_batch([21, 0, 1, 9], [50, 4, 17, 9], num_heads=2, num_kv_heads=2,
                        head_dim=64, block_size=16, dtype=torch.float32)
    config = AttentionConfig(block_m=16, tile_n=16, num_warps=4, num_stages=1)
    out = paged_attention_triton_impl(*batch.args(), config=config)
    assert_matches_reference(batch, out)


@pytest.mark.parametrize("num_segments", [2, 4, 8])
def test_flash_decoding_split(paged_batch, num_segments):
    # Few decode rows with long-ish contexts; the 8-way split leaves segments of the short
    # sequence empty, which the log-sum-exp merge must ignore.
    batch = paged_batch([1, 1, 1], [150, 21, 97], num_heads=8, num_kv_heads=2, head_dim=80,
                        block_size=16, dtype=torch.float16)
    out = paged_attention_triton_impl(*batch.args(), num_segments=num_segments,
                                      config=AttentionConfig(16, 16, 4, 1))
    assert_matches_reference(batch, out)


def test_write_then_attend_matches_reference(paged_batch):
    # The engine's order: write this step's K/V by slot mapping, then attend over the cache.
    query_lens, seq_lens = [1, 6], [20, 6]
    batch = paged_batch(query_lens, seq_lens, num_heads=4, num_kv_heads=2, head_dim=64,
                        block_size=16, dtype=torch.float16, seed=3)
    gen = torch.Generator().manual_seed(7)
    new_k = torch.randn(sum(query_lens), 2, 64, generator=gen).half()
    new_v = torch.randn(sum(query_lens), 2, 64, generator=gen).half()
    slots = []
    for seq, (q_len, s_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for pos in range(s_len - q_len, s_len):
            slots.append(int(batch.block_tables[seq, pos // 16]) * 16 + pos % 16)
    write_kv_cache_triton(new_k, new_v, batch.k_cache, batch.v_cache, torch.tensor(slots))
    flat_k = batch.k_cache.view(-1, 2, 64)
    assert torch.equal(flat_k[torch.tensor(slots)], new_k)
    assert_matches_reference(batch, paged_attention_triton(*batch.args()))


def test_choose_num_segments():
    # All-decode, one sequence, long context: split up to the cap; powers of two only.
    assert choose_num_segments(1, 8, 1, 32768, num_sms=132) == 32
    assert choose_num_segments(1, 8, 1, 1024, num_sms=132) == 4
    assert choose_num_segments(2, 2, 1, 600, num_sms=132) == 2
    # Short contexts, prefill in the batch, or enough programs already: no split.
    assert choose_num_segments(1, 8, 1, 300, num_sms=132) == 1
    assert choose_num_segments(1, 8, 4, 32768, num_sms=132) == 1
    assert choose_num_segments(64, 8, 1, 32768, num_sms=132) == 1


def test_rejects_mismatched_shapes(paged_batch):
    batch = paged_batch([1], [5], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                        dtype=torch.float32)
    args = list(batch.args())
    args[0] = torch.randn(1, 3, 64)  # 3 query heads do not group over 2 KV heads
    with pytest.raises(ValueError, match="num_kv_heads"):
        paged_attention_triton(*args)
    args = list(batch.args())
    args[4] = args[4][:1]
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention_triton(*args)


@pytest.mark.parametrize("decode_rows", [True, False])
def test_decode_and_chunk_launches_split_the_rows(paged_batch, decode_rows):
    # A mixed batch is two launches: decode rows (one query token) in one, with the decode
    # tiles, and prefill/extend chunks in the other; each leaves the other's rows alone.
    from kvdeck.kernels.triton.attention import _CacheReading, _launch, _LayerOptions

    batch = paged_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                        dtype=torch.float32, seed=11)
    out = torch.full_like(batch.q, float("nan"))
    tensors = (out, batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
               batch.query_start_loc, batch.seq_lens, out, out, out, out, out)
    options = _LayerOptions(batch.scale, 0, 0.0,
                            _CacheReading.of(batch.k_cache, batch.v_cache, None, None))
    _launch(tensors, options, attention_tuning.DECODE_CONFIG if decode_rows
            else attention_tuning.PREFILL_CONFIG, num_segments=1, decode_rows=decode_rows)
    query_lens = torch.diff(batch.query_start_loc)
    is_decode_token = torch.repeat_interleave(query_lens == 1, query_lens)
    served = is_decode_token if decode_rows else ~is_decode_token
    expected = paged_attention_torch(*batch.as_fp32())
    torch.testing.assert_close(out[served], expected[served], atol=2e-5, rtol=2e-5)
    assert out[~served].isnan().all()


# Hopper's tiles: the interpreter runs any tiles, these are the ones an H100 launches.
@pytest.mark.parametrize("prefill_tiles, decode_tiles, head_dim", [
    ("PREFILL_CONFIG", "DECODE_CONFIG", 96),
    ("HOPPER_PREFILL_CONFIG", "HOPPER_DECODE_CONFIG", 128),
])
def test_mixed_batch_with_separate_decode_tiles(paged_batch, prefill_tiles, decode_tiles, head_dim):
    batch = paged_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=head_dim, block_size=16,
                        dtype=torch.float16, seed=12)
    out = paged_attention_triton_impl(*batch.args(), config=getattr(attention_tuning, prefill_tiles),
                                      decode_config=getattr(attention_tuning, decode_tiles))
    assert_matches_reference(batch, out)


@pytest.mark.parametrize("arch", [80, 86, 89, 90])
def test_default_config_per_launch_and_row_width(arch):
    cuda, at = torch.device("cuda"), attention_tuning

    def config(max_query_len, head_dim, element_size=2):
        return at.default_config(max_query_len, head_dim, cuda, element_size, arch=arch)

    hopper = arch == at.HOPPER_ARCH
    assert config(1, 128) == (at.HOPPER_DECODE_CONFIG if hopper else at.DECODE_CONFIG)
    assert config(1, 64) == (at.HOPPER_DECODE_CONFIG if hopper else at.DECODE_CONFIG)
    assert config(7, 128) == (at.HOPPER_PREFILL_CONFIG if hopper else at.PREFILL_CONFIG)
    assert config(7, 64) == at.PREFILL_CONFIG_SMALL_HEAD
    # 512-byte K/V rows (head dim 256 in bf16, 128 in fp32) take the half-length KV tiles,
    # and 8-bit caches their own, on Hopper too (the H100 sweep timed 16-bit rows only).
    assert config(1, 256) == at.DECODE_CONFIG_WIDE_ROWS
    assert config(1, 128, element_size=4) == at.DECODE_CONFIG_WIDE_ROWS
    assert config(9, 160) == at.PREFILL_CONFIG_WIDE_ROWS
    assert config(1, 128, element_size=1) == at.DECODE_CONFIG_8BIT
    assert config(7, 128, element_size=1) == at.PREFILL_CONFIG
    assert config(1, 64, element_size=4) == at.DECODE_CONFIG


def test_cache_offsets_are_32_bit_below_2_31_elements():
    # The kernel addresses a cache in 32-bit offsets unless an element lies 2^31 or more past
    # its start (then 64-bit): a meta tensor has the shape without the memory.
    from kvdeck.kernels.triton.attention import _CacheReading, element_span

    small = torch.empty(64, 16, 8, 128)
    assert element_span(small) == small.numel() and element_span(small[:, :, 1]) == small.numel() - 7 * 128
    assert not _CacheReading.of(small, small, None, None).wide_offsets
    wide = torch.empty(1 << 17, 16, 8, 128, device="meta")  # 2^31 elements
    assert element_span(wide) == 1 << 31 and element_span(torch.empty(0)) == 0
    assert _CacheReading.of(wide, wide, None, None).wide_offsets
    assert not _CacheReading.of(wide[:-1], wide[:-1], None, None).wide_offsets


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_64_bit_offsets_read_the_same_cache(paged_batch, monkeypatch, kv):
    # A cache past 2^31 elements takes the 64-bit form: on a small cache it must read the same
    # keys and values, bit for bit, as the 32-bit form does.
    from kvdeck.kernels.triton import attention as attention_triton

    batch = paged_batch(*MIXED, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                        dtype=torch.float16, seed=3)
    args = batch.args()
    scales = {}
    if kv == "int8":  # an int8 cache and its per-(token, head) scales, read through the same offsets
        k8 = torch.randint(-127, 128, args[1].shape, dtype=torch.int8)
        v8 = torch.randint(-127, 128, args[2].shape, dtype=torch.int8)
        scales = dict(k_scale=torch.rand(args[1].shape[:3], dtype=torch.float16),
                      v_scale=torch.rand(args[1].shape[:3], dtype=torch.float16))
        args = (args[0], k8, v8, *args[3:])
    forms, launch = [], attention_triton.launch

    def recording(kernel, grid, *launch_args, **kwargs):
        forms.append(kwargs.get("WIDE_OFFSETS"))
        return launch(kernel, grid, *launch_args, **kwargs)

    monkeypatch.setattr(attention_triton, "launch", recording)
    narrow = paged_attention_triton(*args, **scales)
    monkeypatch.setattr(attention_triton, "element_span", lambda t: 1 << 31)
    wide = paged_attention_triton(*args, **scales)
    assert torch.equal(wide, narrow)
    # Both launches (the decode rows, the chunks) each way; the merge takes no such argument.
    assert [form for form in forms if form is not None] == [False, False, True, True]
