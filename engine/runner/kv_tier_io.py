"""The runner's side of the prefix cache's host and disk tiers (`engine/core/kv_tiers.py`):
the host tier's buffer, and a step's copies between it, the disk's bytes and the pool.

A step's `TierTransfers` run before its forward, in this order: the device blocks evicted to
the host tier are gathered (before anything overwrites them) and put in their host rows; then
the host tier's and the disk's hits are scattered into the device blocks that take them. A
host row is never both read and overwritten in one step (the core does not evict a row it
loads from), so putting first lets a block evicted and hit in the same step come back whole.
"""

import numpy as np
import torch

from kvdeck.engine.runner.kv_block_copy import HostKVBlocks, KVBlockCopier
from kvdeck.engine.runner.tier_transfers import TierTransfers


class KVTierIO:
    def __init__(self, copier: KVBlockCopier, host_rows: int) -> None:
        self.copier = copier
        self.part_sizes = [row.shape[1] for row in copier.rows]
        self.block_bytes = copier.block_bytes
        self.host: HostKVBlocks | None = copier.allocate_host(host_rows) if host_rows else None

    @torch.inference_mode()
    def save(self, transfers: TierTransfers) -> None:
        """The step's first copies: evicted device blocks into their host rows. (Swap-outs'
        gathers may run before or after; every scatter into the pool runs after both.)"""
        if transfers.offload:
            self._host().put(list(transfers.offload),
                             self.copier.gather_blocks(list(transfers.offload.values())))

    @torch.inference_mode()
    def load(self, transfers: TierTransfers) -> None:
        """Then the host tier's and the disk's hits into their device blocks."""
        if transfers.host_loads:
            rows = [row for row, _ in transfers.host_loads]
            self.copier.scatter_blocks([block for _, block in transfers.host_loads],
                                       self._host().take(rows))
        for block_ids, data in transfers.disk_loads:
            self.copier.scatter_blocks(block_ids, self.from_bytes(data, len(block_ids)))

    @torch.inference_mode()
    def gather_bytes(self, block_ids: list[int]) -> np.ndarray:
        """The blocks' KV as uint8 rows [n, block_bytes] (each row a block's parts in order)."""
        gathered = self.copier.gather_blocks(block_ids)
        return torch.cat(gathered.parts, dim=1).numpy()

    def from_bytes(self, data: bytearray, num_blocks: int) -> HostKVBlocks:
        """`num_blocks` blocks of bytes (as gather_bytes makes them) as host blocks, no copy."""
        flat = torch.frombuffer(data, dtype=torch.uint8, count=num_blocks * self.block_bytes)
        return HostKVBlocks(list(flat.view(num_blocks, self.block_bytes).split(self.part_sizes, dim=1)))

    def _host(self) -> HostKVBlocks:
        if self.host is None:
            raise RuntimeError("a host-tier copy without a host tier (kv_offload_gib is 0)")
        return self.host
