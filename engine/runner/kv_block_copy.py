"""Copy whole KV blocks between the device pool and host memory, batched.

Swap preemption and the host / disk prefix tiers move blocks in and out of the pool
(`kv_pool.py`). A block's KV is spread over every cache tensor of the pool: K and V per
storage slot, and int8's scales beside them. Each tensor is viewed as raw bytes
`[num_blocks, bytes per block]`, so one copy path serves every KV format bit for bit
(fp8 has no index kernels on the CPU; bytes do) and a host buffer is a list of uint8
rows, one list entry per cache tensor.

`gather_blocks` is one index_select per tensor (on CUDA then one copy into pinned host
memory, waited for); `scatter_blocks` one index_copy_ per tensor (on CUDA the host rows
go up asynchronously on the current stream, so a forward enqueued after it reads them).
Both are plain stream-ordered work: call them outside a CUDA graph, before the forward
that reuses or reads the blocks.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvdeck.engine.runner.kv_pool import KVPool


@dataclass(slots=True)
class HostKVBlocks:
    """Blocks' KV in host memory: `parts[i]` is uint8 `[n, bytes of tensor i per block]`."""
    parts: list[torch.Tensor]

    @property
    def num_blocks(self) -> int:
        return self.parts[0].shape[0] if self.parts else 0

    @property
    def nbytes(self) -> int:
        return sum(part.numel() for part in self.parts)

    def take(self, rows: Sequence[int]) -> "HostKVBlocks":
        """Rows `rows` as a new buffer (pinned where this one is)."""
        index = torch.tensor(list(rows), dtype=torch.long)
        out = []
        for part in self.parts:
            dest = torch.empty((len(rows), part.shape[1]), dtype=torch.uint8,
                               pin_memory=part.is_pinned())
            out.append(torch.index_select(part, 0, index, out=dest))
        return HostKVBlocks(out)

    def put(self, rows: Sequence[int], blocks: "HostKVBlocks") -> None:
        """Store `blocks` (one row per entry of `rows`) at `rows` of this buffer."""
        _check_layout(self, blocks, len(rows))
        index = torch.tensor(list(rows), dtype=torch.long)
        for part, src in zip(self.parts, blocks.parts, strict=True):
            part.index_copy_(0, index, src)


class KVBlockCopier:
    """Gathers and scatters whole blocks of one pool's cache tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        if not tensors:
            raise ValueError("a KV block copier needs the pool's cache tensors (allocate the pool first)")
        num_blocks = tensors[0].shape[0]
        if any(t.shape[0] != num_blocks for t in tensors):
            raise ValueError("every cache tensor of a pool has the same number of blocks")
        # Raw bytes, one row per block: views share the pool's memory.
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("the pool's cache tensors must be contiguous to be copied by block")
        self.rows = [t.view(torch.uint8).view(num_blocks, -1) for t in tensors]
        self.num_blocks = num_blocks
        self.device = tensors[0].device

    @classmethod
    def from_pool(cls, pool: KVPool) -> "KVBlockCopier":
        """Every cache tensor of a `KVPool`: K and V per slot, then int8's scales."""
        return cls([*pool.k, *pool.v, *pool.k_scales, *pool.v_scales])

    @property
    def block_bytes(self) -> int:
        """Bytes of one block's KV over every tensor (scales included)."""
        return sum(row.shape[1] for row in self.rows)

    def allocate_host(self, num_blocks: int) -> HostKVBlocks:
        """A host buffer for `num_blocks` blocks, uninitialised (a row is written before it is
        read; untouched pages cost no memory on the CPU), pinned when the pool is on CUDA."""
        pin = self.device.type == "cuda"
        return HostKVBlocks([torch.empty((num_blocks, row.shape[1]), dtype=torch.uint8,
                                         pin_memory=pin) for row in self.rows])

    def gather_blocks(self, block_ids: Sequence[int]) -> HostKVBlocks:
        """The KV of `block_ids` (in that order) copied to host memory; complete on return."""
        index = self._index(block_ids)
        if self.device.type != "cuda":
            return HostKVBlocks([row.index_select(0, index) for row in self.rows])
        parts = []
        for row in self.rows:
            dest = torch.empty((len(block_ids), row.shape[1]), dtype=torch.uint8, pin_memory=True)
            dest.copy_(row.index_select(0, index), non_blocking=True)
            parts.append(dest)
        torch.cuda.current_stream(self.device).synchronize()  # the host reads them next
        return HostKVBlocks(parts)

    def scatter_blocks(self, block_ids: Sequence[int], blocks: HostKVBlocks) -> None:
        """Write `blocks` (one row per id) into the pool's blocks `block_ids`."""
        _check_layout(HostKVBlocks([r[:0] for r in self.rows]), blocks, len(block_ids))
        index = self._index(block_ids)
        non_blocking = self.device.type == "cuda"
        for row, src in zip(self.rows, blocks.parts, strict=True):
            row.index_copy_(0, index, src.to(self.device, non_blocking=non_blocking))

    def _index(self, block_ids: Sequence[int]) -> torch.Tensor:
        ids = list(block_ids)
        if ids and not (0 <= min(ids) and max(ids) < self.num_blocks):
            raise ValueError(f"block ids must be in [0, {self.num_blocks}), got {ids}")
        index = torch.tensor(ids, dtype=torch.long)
        return index.to(self.device, non_blocking=True) if self.device.type == "cuda" else index


def _check_layout(dest: HostKVBlocks, src: HostKVBlocks, num_rows: int) -> None:
    if len(dest.parts) != len(src.parts) or any(
            d.shape[1] != s.shape[1] for d, s in zip(dest.parts, src.parts, strict=True)):
        raise ValueError("the host blocks come from a pool of another layout")
    if src.num_blocks != num_rows:
        raise ValueError(f"{num_rows} block ids for {src.num_blocks} host blocks")
