"""The prefix cache's lower tiers: a host-memory LRU pool (`kv_offload_gib`) and a folder on
disk that outlives the process (`kv_cache_dir`), behind the device pool's prefix cache.

The block manager asks them three things (docs/architecture/kv-tiers.md):
- `find`: past the device pool's longest hit, which of the next blocks the host tier holds
  (by chained hash and token ids) or the disk holds (by a blake2b key chained from the model's
  fingerprint and the prefix's root, `kv_disk_store.py`). Those blocks take fresh device
  blocks and are copied in before the forward that reads them; then they are ordinary
  prefix-cache hits.
- `evicted`: a cached device block is about to be reused; with a host tier it is copied into
  a host row first (the copy runs before anything overwrites the block in that step).
- `registered`: a block became full and was hashed; with a disk tier it is written (at the
  end of the step: gathered, then handed to the writer thread). Writing when full, not when
  evicted, is what makes a restart find a finished conversation: the device pool is never
  evicted on the way out, and a crash loses only the writes still queued.
Disk reads happen when a request is admitted (`fetch`), before its blocks are taken, so a
file that turns out missing or corrupt shortens the hit instead of leaving a block unfilled.

The core's side is bookkeeping only (no torch); the runner's `KVTierIO` holds the host rows'
contents and does the copies a step's `TierTransfers` lists.
"""

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvdeck.engine.core.block_manager import CachedPrefix, TierLoad, _root_hash, chain_hash
from kvdeck.engine.core.kv_disk_store import DiskBlockStore, chain_key, root_key
from kvdeck.engine.core.request import Request
from kvdeck.engine.runner.tier_transfers import TierTransfers

_MAX_CHAINS = 4096  # requests whose disk keys are kept (each: 32 bytes a block)


@dataclass(slots=True)
class _HostEntry:
    row: int
    token_ids: tuple[int, ...]


@dataclass(slots=True)
class TierCounters:
    """Prompt tokens (since start) looked up in each tier, those the tiers above it missed, and
    found there."""

    host_queries: int = 0
    host_hits: int = 0
    disk_queries: int = 0
    disk_hits: int = 0
    host_offloads: int = 0  # blocks copied from the device pool to the host tier


@dataclass(slots=True)
class _Fetched:
    """The last admission's disk reads, kept while it waits for blocks."""

    request: Request
    keys: tuple[bytes, ...]
    data: bytearray
    num_read: int


class KVTiers:
    def __init__(self, block_size: int, block_bytes: int, host_rows: int,
                 disk: DiskBlockStore | None, fingerprint: str) -> None:
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.host_rows = host_rows
        self.disk = disk
        self.fingerprint = fingerprint
        self.host: OrderedDict[int, _HostEntry] = OrderedDict()  # chained hash -> row, LRU first
        self._free_rows: deque[int] = deque(range(host_rows))
        self._busy_rows: set[int] = set()  # read by this step's loads: not evicted in it
        self.pending = TierTransfers()
        self.to_store: list[tuple[int, bytes, tuple[int, ...]]] = []  # (device block, key, ids)
        # Per request id: (the request, its root hash, its blocks' disk keys so far)
        self._chains: OrderedDict[str, tuple[Request, int, list[bytes]]] = OrderedDict()
        self._fetched: _Fetched | None = None
        self.counters = TierCounters()

    # ---- lookups ---------------------------------------------------------------------
    def find(self, request: Request, num_device_blocks: int, parent_hash: int,
             max_blocks: int) -> list[TierLoad]:
        """The blocks after the device pool's `num_device_blocks` hits that a lower tier holds,
        in a row (each block from either tier), up to `max_blocks`."""
        tokens = request.all_token_ids
        size = self.block_size
        keys = self._disk_keys(request, max_blocks) if self.disk is not None else None
        loads: list[TierLoad] = []
        parent = parent_hash
        for i in range(num_device_blocks, max_blocks):
            ids = tuple(tokens[i * size : (i + 1) * size])
            parent = chain_hash(parent, ids)
            entry = self.host.get(parent)
            if entry is not None and entry.token_ids == ids:
                loads.append(TierLoad(parent, ids, host_row=entry.row))
            elif keys is not None and self.disk.contains(keys[i]):
                loads.append(TierLoad(parent, ids, disk_key=keys[i]))
            else:
                break
        return loads

    def fetch(self, request: Request, cached: CachedPrefix) -> None:
        """Before the request takes blocks: read its disk hits and keep its host rows from
        eviction this step; a disk block that cannot be read ends the hit there."""
        for load in cached.loads:
            if load.host_row >= 0:
                self._busy_rows.add(load.host_row)
        keys = tuple(load.disk_key for load in cached.loads if load.host_row < 0)
        if not keys:
            return
        fetched = self._fetched
        if fetched is None or fetched.request is not request or fetched.keys != keys:
            fetched = self._fetched = _Fetched(request, keys, bytearray(len(keys) * self.block_bytes), 0)
            out = memoryview(fetched.data)
            for load in cached.loads:
                if load.host_row >= 0:
                    continue
                start = fetched.num_read * self.block_bytes
                if not self.disk.read(load.disk_key, load.token_ids, out[start : start + self.block_bytes]):
                    break
                fetched.num_read += 1
        if fetched.num_read < len(keys):  # cut at the first unreadable disk block
            failed = keys[fetched.num_read]
            cut = next(i for i, load in enumerate(cached.loads) if load.disk_key == failed)
            cached.num_blocks -= len(cached.loads) - cut
            del cached.loads[cut:]
            del cached.hashes[cached.num_blocks:]

    def place(self, cached: CachedPrefix, block_ids: list[int]) -> None:
        """The request took `block_ids` for its lower-tier hits: copy them in this step."""
        num_host = sum(1 for load in cached.loads if load.host_row >= 0)
        if self.host_rows:
            self.counters.host_queries += cached.lower_queried * self.block_size
        if self.disk is not None:
            self.counters.disk_queries += (cached.lower_queried - num_host) * self.block_size
        disk_blocks = []
        for load, block_id in zip(cached.loads, block_ids, strict=True):
            if load.host_row >= 0:
                self.pending.host_loads.append((load.host_row, block_id))
                self.host.move_to_end(load.hash)
                self.counters.host_hits += self.block_size
            else:
                disk_blocks.append(block_id)
                self.counters.disk_hits += self.block_size
        if disk_blocks:
            data = self._fetched.data[: len(disk_blocks) * self.block_bytes]
            self.pending.disk_loads.append((disk_blocks, data))
        self._fetched = None

    def take_transfers(self) -> TierTransfers:
        """This step's copies (the scheduler puts them on its batch)."""
        transfers, self.pending = self.pending, TierTransfers()
        self._busy_rows.clear()
        return transfers

    # ---- the device pool's events ---------------------------------------------------------
    def evicted(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        """A cached device block is being reused: keep its KV in the host tier."""
        if not self.host_rows:
            return
        entry = self.host.get(block_hash)
        if entry is not None and entry.token_ids == token_ids:
            self.host.move_to_end(block_hash)
            return
        if entry is not None:  # same hash, other tokens: the newer block takes the key
            if entry.row in self._busy_rows:
                return
            del self.host[block_hash]
            self._free_rows.append(entry.row)
        row = self._take_row()
        if row is None:
            return
        self.host[block_hash] = _HostEntry(row, token_ids)
        self.pending.offload[row] = block_id
        self.counters.host_offloads += 1

    def registered(self, request: Request, index: int, block_id: int, token_ids: tuple[int, ...]) -> None:
        """Block `index` of the request became full and cached: write it to disk after the step."""
        if self.disk is None:
            return
        key = self._disk_keys(request, index + 1)[index]
        if not self.disk.contains(key):
            self.to_store.append((block_id, key, token_ids))

    def store_registered(self, gather: Callable[[list[int]], np.ndarray]) -> None:
        """Hand this step's newly cached blocks to the disk writer (called after the step)."""
        if not self.to_store:
            return
        items, self.to_store = self.to_store, []
        rows = gather([block_id for block_id, _, _ in items])
        for (_, key, token_ids), row in zip(items, rows):
            self.disk.write(key, token_ids, memoryview(row))

    def forget(self, request_id: str) -> None:
        self._chains.pop(request_id, None)
        if self._fetched is not None and self._fetched.request.request_id == request_id:
            self._fetched = None

    def reset(self) -> None:
        """Forget the host tier (reset_prefix_cache); the disk keeps its files."""
        self._free_rows.extend(entry.row for entry in self.host.values())
        self.host.clear()

    def close(self) -> None:
        """Write what is queued (a clean shutdown), then stop the writer."""
        if self.disk is not None:
            self.disk.close()

    # ---- internals -----------------------------------------------------------------------
    def _take_row(self) -> int | None:
        if self._free_rows:
            return self._free_rows.popleft()
        for block_hash, entry in self.host.items():  # LRU first
            if entry.row not in self._busy_rows:
                del self.host[block_hash]
                return entry.row
        return None

    def _disk_keys(self, request: Request, num_blocks: int) -> list[bytes]:
        """The disk keys of the request's first `num_blocks` blocks (kept per request)."""
        root = _root_hash(request)
        chain = self._chains.get(request.request_id)
        if chain is None or chain[0] is not request or chain[1] != root:
            chain = (request, root, [])
            self._chains[request.request_id] = chain
            if len(self._chains) > _MAX_CHAINS:
                self._chains.popitem(last=False)
        keys = chain[2]
        size = self.block_size
        parent = keys[-1] if keys else root_key(self.fingerprint + _adapter_files(request), root)
        for i in range(len(keys), num_blocks):
            parent = chain_key(parent, request.token_ids_between(i * size, (i + 1) * size))
            keys.append(parent)
        return keys


def _adapter_files(request: Request) -> str:
    """A LoRA request's adapter files (names, sizes, mtimes): its root hash names the adapter's
    name and folder, and an adapter trained again in place must not reuse the old K/V."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return ""
    folder = Path(lora.lora_path).expanduser()
    try:
        stats = [(p.name, p.stat()) for p in folder.iterdir() if p.is_file()]
        files = sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats)
    except OSError:
        files = []
    return f":{folder}:{files}"
