"""The prefix cache's disk tier: full KV blocks in files that outlive the process.

One file per block, `DIR/<model fingerprint>/<key[:2]>/<key>.kvb`. The key is a blake2b chain
over the block's token ids from a root that names the request's prefix root (LoRA adapter,
LongRoPE factors), so a key says the whole prefix; the fingerprint names the model's files,
dtype, KV format, block size and this file layout, so a changed model never reads another's
blocks (it looks in another folder).

A file is written to a temporary name and renamed, and carries a checksum of everything after
it: a reader never sees a half-written file, and a truncated or corrupt one (a crash before
the data reached the disk, a bad sector) fails its checksum and is removed. Writes run on a
background thread behind a queue bounded in bytes; a write that would overflow it is dropped
(the step never waits for the disk). The folder is bounded in size: past `max_bytes`, the
least recently used files (written or read: their mtime) go first, over every model's files.
"""

import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 1  # of the bytes of a block's KV and of this file format
MAGIC = b"KVDKBLK1"
SUFFIX = ".kvb"
# magic, checksum (of everything after it), key, tokens, parts, payload bytes
_HEADER = struct.Struct("<8s16s32sIIQ")
KEY_BYTES = 32
_STALE_TEMP_S = 600.0  # a temporary file this old is a crashed writer's
DEFAULT_QUEUE_BYTES = 512 * 2**20


def chain_key(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The disk key of a block: its parent's key and its token ids (blake2b, 256 bits)."""
    return hashlib.blake2b(parent + struct.pack(f"<{len(token_ids)}q", *token_ids),
                           digest_size=KEY_BYTES).digest()


def root_key(fingerprint: str, root_hash: int) -> bytes:
    """The parent key of a request's first block: the model and the prefix's root."""
    return hashlib.blake2b(f"{fingerprint}:{root_hash}".encode(), digest_size=KEY_BYTES).digest()


@dataclass(slots=True)
class DiskCounters:
    writes: int = 0  # blocks written
    writes_dropped: int = 0  # the queue was full
    write_errors: int = 0
    reads: int = 0
    corrupt_removed: int = 0  # failed their checksum or layout: removed
    evicted: int = 0  # removed by the size bound


class DiskBlockStore:
    def __init__(self, root: Path, fingerprint: str, part_sizes: Sequence[int], max_bytes: int,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"the KV cache folder needs a size bound > 0 bytes, got {max_bytes}")
        self.root = Path(root).expanduser()
        self.dir = self.root / fingerprint
        self.part_sizes = list(part_sizes)
        self.block_bytes = sum(self.part_sizes)
        self.max_bytes = max_bytes
        self.queue_bytes = queue_bytes
        self.counters = DiskCounters()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"kv_cache_dir {str(self.root)!r} cannot be created: {exc}") from None
        if not os.access(self.dir, os.W_OK):
            raise ValueError(f"kv_cache_dir {str(self.root)!r} is not writable")
        self._lock = threading.Lock()
        self._files: OrderedDict[Path, int] = OrderedDict()  # every block file, LRU first: bytes
        self._keys: set[bytes] = set()  # this model's keys on disk
        self._pending: set[bytes] = set()  # queued, not yet written
        self._pending_bytes = 0
        self.total_bytes = 0
        self._scan()
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kvdeck-kv-disk-writer",
                                        daemon=True)
        self._writer.start()
        self._closed = False

    # ---- queries -------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """This model's blocks on disk."""
        return len(self._keys)

    @property
    def file_bytes(self) -> int:
        """About one block's file (its token ids aside): what the size bound counts per block."""
        return _HEADER.size + 8 * len(self.part_sizes) + self.block_bytes

    def contains(self, key: bytes) -> bool:
        return key in self._keys

    def path_of(self, key: bytes) -> Path:
        name = key.hex()
        return self.dir / name[:2] / (name + SUFFIX)

    # ---- read ----------------------------------------------------------------------
    def read(self, key: bytes, token_ids: Sequence[int], out: memoryview) -> bool:
        """Read the block `key` into `out` (block_bytes); False, and the file removed if it is
        damaged, when it is missing, truncated, corrupt or of another layout or tokens."""
        path = self.path_of(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # another process's size bound removed it
            self._forget(path, key)
            return False
        except OSError as exc:
            logger.warning("KV cache file %s cannot be read: %s", path, exc)
            return False
        if not self._valid(data, key, token_ids):
            logger.warning("KV cache file %s is truncated or corrupt: removed", path)
            self.counters.corrupt_removed += 1
            self._remove(path, key)
            return False
        out[:] = memoryview(data)[len(data) - self.block_bytes:]
        self.counters.reads += 1
        try:
            os.utime(path)  # recently used: the size bound removes it last
        except OSError:
            pass
        with self._lock:
            if path in self._files:
                self._files.move_to_end(path)
        return True

    def _valid(self, data: bytes, key: bytes, token_ids: Sequence[int]) -> bool:
        if len(data) < _HEADER.size:
            return False
        magic, checksum, file_key, num_tokens, num_parts, payload = _HEADER.unpack_from(data)
        expected = _HEADER.size + 8 * num_parts + 8 * num_tokens + payload
        if magic != MAGIC or file_key != key or len(data) != expected or payload != self.block_bytes:
            return False
        if hashlib.blake2b(memoryview(data)[24:], digest_size=16).digest() != checksum:
            return False
        offset = _HEADER.size
        sizes = struct.unpack_from(f"<{num_parts}Q", data, offset)
        tokens = struct.unpack_from(f"<{num_tokens}q", data, offset + 8 * num_parts)
        return list(sizes) == self.part_sizes and tokens == tuple(token_ids)

    # ---- write ---------------------------------------------------------------------
    def write(self, key: bytes, token_ids: Sequence[int], payload: memoryview) -> bool:
        """Queue the block for writing; False when it is there already, queued, or the queue
        is full (dropped: the step never waits for the disk)."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes here, got {len(payload)}")
        with self._lock:
            if self._closed or key in self._keys or key in self._pending:
                return False
            if self._pending_bytes + self.block_bytes > self.queue_bytes:
                self.counters.writes_dropped += 1
                return False
            self._pending.add(key)
            self._pending_bytes += self.block_bytes
        self._queue.put((key, tuple(token_ids), payload))
        return True

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                key, token_ids, payload = item
                try:
                    self._write_file(key, token_ids, payload)
                except OSError as exc:
                    self.counters.write_errors += 1
                    logger.warning("KV cache block not written to %s: %s", self.dir, exc)
                finally:
                    with self._lock:
                        self._pending.discard(key)
                        self._pending_bytes -= self.block_bytes
            finally:
                self._queue.task_done()

    def _write_file(self, key: bytes, token_ids: tuple[int, ...], payload: memoryview) -> None:
        body = (struct.pack(f"<{len(self.part_sizes)}Q", *self.part_sizes)
                + struct.pack(f"<{len(token_ids)}q", *token_ids))
        head = struct.pack("<32sIIQ", key, len(token_ids), len(self.part_sizes), len(payload))
        digest = hashlib.blake2b(head, digest_size=16)
        digest.update(body)
        digest.update(payload)
        path = self.path_of(key)
        path.parent.mkdir(exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(temp, "wb") as f:
                f.write(MAGIC + digest.digest() + head)
                f.write(body)
                f.write(payload)
            os.replace(temp, path)  # atomic: a reader sees the whole file or none
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        size = _HEADER.size + len(body) + len(payload)
        with self._lock:
            self._files[path] = size
            self._files.move_to_end(path)
            self._keys.add(key)
            self.total_bytes += size
            self.counters.writes += 1
            victims = self._over_bound()
        for victim in victims:
            victim.unlink(missing_ok=True)

    # ---- the size bound and the index -------------------------------------------------
    def _over_bound(self) -> list[Path]:
        """Drop the least recently used files until the folder fits (under the lock)."""
        victims = []
        while self.total_bytes > self.max_bytes and self._files:
            path, size = self._files.popitem(last=False)
            self.total_bytes -= size
            self._keys.discard(_key_of(path))  # another model's key is never in this set
            self.counters.evicted += 1
            victims.append(path)
        return victims

    def _scan(self) -> None:
        """Index the folder's block files (every model's, oldest use first), remove crashed
        writers' temporary files, and apply the size bound."""
        found = []
        now = time.time()
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                except OSError:
                    continue
                if name.endswith(".tmp") and now - st.st_mtime > _STALE_TEMP_S:
                    path.unlink(missing_ok=True)
                elif name.endswith(SUFFIX):
                    found.append((st.st_mtime, path, st.st_size))
        found.sort(key=lambda entry: entry[0])
        for _mtime, path, size in found:
            self._files[path] = size
            self.total_bytes += size
            if path.parent.parent == self.dir:
                key = _key_of(path)
                if key is not None:
                    self._keys.add(key)
        for victim in self._over_bound():
            victim.unlink(missing_ok=True)

    def _forget(self, path: Path, key: bytes) -> None:
        with self._lock:
            size = self._files.pop(path, None)
            if size is not None:
                self.total_bytes -= size
            self._keys.discard(key)

    def _remove(self, path: Path, key: bytes) -> None:
        self._forget(path, key)
        path.unlink(missing_ok=True)


def _key_of(path: Path) -> bytes | None:
    try:
        key = bytes.fromhex(path.name.removesuffix(SUFFIX))
    except ValueError:
        return None
    return key if len(key) == KEY_BYTES else None
