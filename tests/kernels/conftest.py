"""Kernel tests run Triton through its CPU interpreter.

TRITON_INTERPRET must be set before `triton.jit` first runs (at import of the kernel
modules), so it is set here at import time, ahead of any test module in this folder.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


@dataclass(slots=True)
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    max_query_len: int
    max_seq_len: int

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.query_start_loc,
                self.seq_lens, self.scale, self.max_query_len, self.max_seq_len)

    def as_fp32(self) -> tuple:
        args = list(self.args())
        for i in range(3):
            args[i] = args[i].float()
        return tuple(args)


def build_paged_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    shared_prefix_blocks: int = 0,
    seed: int = 0,
) -> PagedBatch:
    """Random cache and q with shuffled (non-contiguous) physical blocks per sequence.

    `shared_prefix_blocks` > 0 maps the first blocks of every sequence to the same physical
    blocks, as prefix caching does; unused table entries stay 0 as the engine leaves them.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [(s + block_size - 1) // block_size for s in seq_lens]
    max_blocks = max(blocks_needed) + 1  # a spare column of unused (0) entries
    own = sum(max(n - shared_prefix_blocks, 0) for n in blocks_needed)
    num_blocks = own + shared_prefix_blocks + 3
    physical = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    shared, physical = physical[:shared_prefix_blocks], physical[shared_prefix_blocks:]
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for seq, needed in enumerate(blocks_needed):
        for i in range(needed):
            tables[seq, i] = shared[i] if i < shared_prefix_blocks else physical.pop()
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), scale=head_dim**-0.5,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
    )


@pytest.fixture
def paged_batch() -> Callable[..., PagedBatch]:
    return build_paged_batch


@pytest.fixture(autouse=True)
def _one_thread():
    # The interpreter's numpy work gains nothing from threads on a shared 2-core box.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(params=["one_program", "many_programs"])
def tile_budget(request, monkeypatch) -> str:
    """Row-wise kernels take as many rows per program as the tile budget allows; a tiny
    budget splits the same test inputs over many programs (the GPU's situation)."""
    if request.param == "many_programs":
        monkeypatch.setattr("kvdeck.kernels.triton.elementwise_tiling.INTERPRETER_TILE_ELEMENTS", 64)
    return request.param
