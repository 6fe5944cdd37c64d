"""Batched block gather/scatter (engine/runner/kv_block_copy.py): every KV format, bit for bit."""

import pytest
import torch

from kvdeck.engine.runner.kv_block_copy import KVBlockCopier
from kvdeck.engine.runner.kv_pool import KVPool
from kvdeck.engine.runner.kv_swap import KVSwapper
from kvdeck.engine.types.kv_groups import kv_cache_groups
from kvdeck.kernels.reference.kv_quant import kv_cache_format

FORMATS = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"]
NUM_BLOCKS = 12


def _pool(kv_cache_dtype: str, windows=(None, None, 8, 8)) -> KVPool:
    pool = KVPool(kv_cache_format(kv_cache_dtype, torch.float32), kv_cache_groups(list(windows)),
                  block_size=4, num_kv_heads=2, head_dim=8)
    pool.allocate(NUM_BLOCKS, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for tensor in [*pool.k, *pool.v, *pool.k_scales, *pool.v_scales]:
        raw = tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    return pool


def _tensors(pool: KVPool) -> list[torch.Tensor]:
    return [t.view(torch.uint8) for t in [*pool.k, *pool.v, *pool.k_scales, *pool.v_scales]]


@pytest.mark.parametrize("kv_cache_dtype", FORMATS)
def test_gather_then_scatter_into_other_blocks_reproduces_them(kv_cache_dtype):
    pool = _pool(kv_cache_dtype)
    copier = KVBlockCopier.from_pool(pool)
    before = [t.clone() for t in _tensors(pool)]
    sources, targets = [5, 0, 9], [2, 11, 7]
    host = copier.gather_blocks(sources)
    assert host.num_blocks == 3 and host.nbytes == 3 * copier.block_bytes
    copier.scatter_blocks(targets, host)
    for old, new in zip(before, _tensors(pool), strict=True):
        for source, target in zip(sources, targets, strict=True):
            assert torch.equal(new[target], old[source])
        untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
        assert torch.equal(new[untouched], old[untouched])


@pytest.mark.parametrize("kv_cache_dtype", FORMATS)
def test_block_bytes_is_the_pools_block_size(kv_cache_dtype):
    pool = _pool(kv_cache_dtype)
    assert KVBlockCopier.from_pool(pool).block_bytes == pool.bytes_per_block


def test_a_host_pool_keeps_blocks_by_row():
    pool = _pool("int8")
    copier = KVBlockCopier.from_pool(pool)
    host_pool = copier.allocate_host(6)
    host_pool.put([4, 1], copier.gather_blocks([3, 8]))
    expected = [t.clone() for t in _tensors(pool)]
    copier.scatter_blocks([0, 10], host_pool.take([1, 4]))
    for old, new in zip(expected, _tensors(pool), strict=True):
        assert torch.equal(new[0], old[8]) and torch.equal(new[10], old[3])


def test_bad_ids_and_layouts_are_refused():
    copier = KVBlockCopier.from_pool(_pool("float16"))
    with pytest.raises(ValueError, match="block ids"):
        copier.gather_blocks([NUM_BLOCKS])
    with pytest.raises(ValueError, match="2 block ids for 1 host blocks"):
        copier.scatter_blocks([0, 1], copier.gather_blocks([0]))
    other = KVBlockCopier.from_pool(_pool("int8"))
    with pytest.raises(ValueError, match="another layout"):
        copier.scatter_blocks([0], other.gather_blocks([0]))
    assert copier.gather_blocks([]).num_blocks == 0


def test_swap_copies_reuse_a_released_block_and_slot_in_the_same_step():
    """kv_swap.py's order: a swap-out's device block may be the same step's swap-in target, and
    a swap-in's host slot the same step's swap-out destination."""
    pool = _pool("bfloat16")
    swapper = KVSwapper.for_pool(KVBlockCopier.from_pool(pool), 4)
    original = [t.clone() for t in _tensors(pool)]
    swapper.copy(1, swap_out=[(2, 0)], swap_in=[])
    swapper.copy(2, swap_out=[(5, 0)], swap_in=[(0, 5)])
    swapper.copy(3, swap_out=[], swap_in=[(0, 9)])
    for old, new in zip(original, _tensors(pool), strict=True):
        assert torch.equal(new[5], old[2]) and torch.equal(new[9], old[5])
    assert swapper.blocks_out == 2 and swapper.blocks_in == 2
    assert swapper.take_times(2).out_s > 0 and swapper.take_times(2) is None
