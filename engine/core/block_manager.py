"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, per-request block
tables, reference counts, automatic prefix caching, and sliding windows.

A request holds one block table per KV cache group (`engine/types/kv_groups.py`): one for
most models, one per attention span for hybrid ones (Gemma's local and global layers).
Every group's table maps logical block i (token positions i*B .. i*B+B-1) to a block of
the one shared pool. In a group whose layers see a sliding window, blocks that have slid
out of the window of the next token are released as the request advances, and their
entries become NO_BLOCK; the other groups keep theirs.

A full block is identified by a chained hash of (parent block's hash, its token ids);
the ids are stored too, so a hash collision is caught by comparing them. A group's blocks
are cached under (group, hash). Blocks whose last owner released them keep their hash
and stay reusable until they are evicted, least recently freed first. Blocks that hold no
reusable prefix are handed out before any cached block is evicted.
"""

from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.core.request import NO_BLOCK, Request
from kvdeck.engine.types.arith import cdiv
from kvdeck.engine.types.lora import lora_cache_key

if TYPE_CHECKING:
    from kvdeck.engine.core.kv_tiers import KVTiers

_ROOT_HASH = -1
# The same tokens rotated with LongRoPE's long factors differ. (Not -2: hash(-1) == -2.)
_LONG_ROPE_ROOT_HASH = -3


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] | None = None
    group: int = 0  # the KV group whose prefix it caches (meaningful with a hash)


@dataclass(slots=True)
class TierLoad:
    """A block the host or disk tier holds (engine/core/kv_tiers.py), to copy into a fresh
    device block before the forward that reads it."""

    hash: int
    token_ids: tuple[int, ...]
    host_row: int = -1  # its host-tier row; -1: it comes from disk
    disk_key: bytes = b""


@dataclass(slots=True)
class CachedPrefix:
    """A prefix-cache hit: the request's first `num_blocks` blocks are in the cache."""

    num_blocks: int = 0
    hashes: list[int] = field(default_factory=list)  # chained hash of each of those blocks
    # Per group, its blocks for those positions; NO_BLOCK where its window does not reach.
    tables: list[list[int]] = field(default_factory=list)
    # The last len(loads) of the num_blocks come from the host or disk tier, not the pool's
    # tables; lower_queried: the blocks past the pool's hit the lower tiers were asked for.
    loads: list[TierLoad] = field(default_factory=list)
    lower_queried: int = 0


def _root_hash(request: Request) -> int:
    root = _LONG_ROPE_ROOT_HASH if request.long_rope else _ROOT_HASH
    # K/V computed under a LoRA adapter are not the base's: its blocks chain from a root of its own.
    lora = getattr(request, "lora_request", None)
    return root if lora is None else hash((root, lora_cache_key(lora)))


def chain_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 windows: Sequence[int | None] = (None,), track_changes: bool = False) -> None:
        """`windows`: the keys each KV group's layers see (None: all of them). `track_changes`:
        list in `changed` every request whose tables change (the scheduler hands the list to the
        runner, whose persistent rows then look at those requests only)."""
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.windows = list(windows)
        self.windowed = any(window is not None for window in self.windows)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 0, LRU first
        self.hash_to_block: dict[tuple[int, int], int] = {}  # (group, hash) -> block
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_window_released = 0  # blocks released because they left a sliding window
        # Block-table entries the requests hold (a shared block once per holder): the
        # occupancy a benchmark reads every step, kept as it changes rather than counted.
        self.num_held_entries = 0
        self.track_changes = track_changes
        self.changed: list[Request] = []
        self.tiers: KVTiers | None = None  # the host / disk tiers behind the pool (kv_tiers.py)

    # ---- queries ---------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def take_changed(self) -> list[Request]:
        """The requests whose tables changed since the last call (repeats possible)."""
        changed, self.changed = self.changed, []
        return changed

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- prefix cache ------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> CachedPrefix:
        """The longest run of leading blocks the cache can serve for the request's tokens.

        A full-attention group needs every block of the run cached; a windowed group only
        the blocks its next query can see (the last cdiv(window - 1, block_size)). The last
        token is never served from the cache: its logits are needed.
        """
        if not self.enable_prefix_caching or request.needs_prompt_logprobs:
            return CachedPrefix(tables=[[] for _ in self.windows])
        max_blocks = (request.num_tokens - 1) // self.block_size
        full = [g for g, window in enumerate(self.windows) if window is None]
        hits: list[list[int | None]] = [[] for _ in self.windows]  # block per group, or None
        hashes: list[int] = []
        for h, ids in self._block_hashes(request, max_blocks):
            found = [self._lookup(g, h, ids) for g in range(self.num_groups)]
            if any(found[g] is None for g in full):
                break  # the full groups' run ends here, and with it every hit
            hashes.append(h)
            for g, block_id in enumerate(found):
                hits[g].append(block_id)
        num_blocks = self._longest_window_hit(hits, len(hashes))
        tables = []
        for g, window in enumerate(self.windows):
            reach = num_blocks if window is None else min(num_blocks, cdiv(window - 1, self.block_size))
            tables.append([NO_BLOCK] * (num_blocks - reach) + hits[g][num_blocks - reach : num_blocks])
        cached = CachedPrefix(num_blocks, hashes[:num_blocks], tables)
        if self.tiers is not None and num_blocks == len(hashes) < max_blocks:  # one full-attention group
            cached.loads = self.tiers.find(request, num_blocks, hashes[-1] if hashes else _root_hash(request),
                                           max_blocks)
            cached.lower_queried = max_blocks - num_blocks
            cached.num_blocks += len(cached.loads)
            cached.hashes += [load.hash for load in cached.loads]
        return cached

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    # ---- allocation ----------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       cached: CachedPrefix | None = None) -> bool:
        """Make every group's table cover num_computed_tokens (+ cached hits) + num_new_tokens.

        Returns False, changing nothing, when the pool cannot supply the blocks.
        """
        if cached is None and request.block_tables:
            return self._extend_tables(request, num_new_tokens)
        tables = request.block_tables or [[] for _ in self.windows]
        if cached is not None and cached.loads:  # disk reads now: one that fails shortens the hit
            self.tiers.fetch(request, cached)
        hit_tables = cached.tables if cached is not None else [[] for _ in self.windows]
        num_hit_blocks = cached.num_blocks if cached is not None else 0
        num_computed = request.num_computed_tokens + num_hit_blocks * self.block_size
        total = self.blocks_needed(num_computed + num_new_tokens)
        num_new_blocks = sum(max(total - len(table) - len(hit), 0)
                             for table, hit in zip(tables, hit_tables))
        hit_blocks = [b for hit in hit_tables for b in hit if b != NO_BLOCK]
        # Touching an evictable hit takes it out of the free pool.
        reclaimed = sum(1 for b in hit_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks > self.num_free_blocks - reclaimed:
            return False
        for block_id in hit_blocks:
            self._touch(block_id)
        request.block_tables = tables
        self.num_held_entries += len(hit_blocks) + num_new_blocks
        if self.track_changes and (hit_blocks or num_new_blocks):
            self.changed.append(request)
        first_load = len(tables[0]) + len(hit_tables[0])
        for table, hit in zip(tables, hit_tables):
            table.extend(hit)
            table.extend(self._pop_free_block() for _ in range(total - len(table)))
        if cached is not None:
            request.block_hashes.extend(cached.hashes)
            if self.tiers is not None:  # (counts the lookup, with or without hits)
                self._place_loads(cached, tables[0][first_load : first_load + len(cached.loads)])
        return True

    def _place_loads(self, cached: CachedPrefix, block_ids: list[int]) -> None:
        """Cache the blocks that take lower-tier hits under their hashes (the runner fills them
        before this step's forward) and have the tiers copy them in."""
        for load, block_id in zip(cached.loads, block_ids, strict=True):
            block = self.blocks[block_id]
            if (0, load.hash) not in self.hash_to_block:
                block.hash, block.token_ids, block.group = load.hash, load.token_ids, 0
                self.hash_to_block[(0, load.hash)] = block_id
        self.tiers.place(cached, block_ids)

    def _extend_tables(self, request: Request, num_new_tokens: int) -> bool:
        """allocate_slots for a request that holds its tables and takes no cached prefix (a
        running request's next tokens, most calls): new blocks at the tables' ends only."""
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        tables = request.block_tables
        num_new_blocks = sum(max(total - len(table), 0) for table in tables)
        if not num_new_blocks:
            return True
        if num_new_blocks > self.num_free_blocks:
            return False
        self.num_held_entries += num_new_blocks
        if self.track_changes:
            self.changed.append(request)
        for table in tables:
            for _ in range(total - len(table)):
                table.append(self._pop_free_block())
        return True

    def restore_tables(self, request: Request, layout: list[list[bool]]) -> list[int]:
        """Fresh blocks for a request that holds none, where `layout` (per group, per entry)
        says a block was held (swap-in, engine/core/swap.py); the caller checked they are free.
        Returns them group by group in table order."""
        tables = [[self._pop_free_block() if held else NO_BLOCK for held in group] for group in layout]
        request.block_tables = tables
        taken = [b for table in tables for b in table if b != NO_BLOCK]
        self.num_held_entries += len(taken)
        self._rewritten(request)
        return taken

    def cache_full_blocks(self, request: Request) -> None:
        """Register every block whose tokens are all computed under its chained hash."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        parent = request.block_hashes[-1] if request.block_hashes else _root_hash(request)
        for i in range(len(request.block_hashes), num_full):
            ids = request.token_ids_between(i * self.block_size, (i + 1) * self.block_size)
            h = chain_hash(parent, ids)
            request.block_hashes.append(h)
            parent = h
            for g, table in enumerate(request.block_tables):
                block = self.blocks[table[i]] if table[i] != NO_BLOCK else None
                if block is not None and (g, h) not in self.hash_to_block and block.hash is None:
                    block.hash, block.token_ids, block.group = h, ids, g
                    self.hash_to_block[(g, h)] = block.block_id
                    if self.tiers is not None:  # the disk tier writes it
                        self.tiers.registered(request, i, block.block_id, ids)

    def release_out_of_window(self, request: Request) -> None:
        """Release, in windowed groups, the blocks no later query of the request can see:
        those wholly before the window of its next token (position num_computed_tokens)."""
        for window, table in zip(self.windows, request.block_tables):
            if window is None:
                continue
            first_seen = max(0, request.num_computed_tokens - window + 1) // self.block_size
            released = first_seen
            while released > 0 and table[released - 1] != NO_BLOCK:
                released -= 1  # earlier entries were released by earlier steps
            if released < first_seen:
                self._rewritten(request)
            for i in range(released, first_seen):  # oldest first: evicted first
                self._release(table[i])
                table[i] = NO_BLOCK
                self.num_window_released += 1
                self.num_held_entries -= 1

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so shared prefixes are evicted last."""
        for table in request.block_tables:
            for block_id in reversed(table):
                if block_id != NO_BLOCK:
                    self._release(block_id)
                    self.num_held_entries -= 1
        request.block_tables = []
        request.block_hashes = []
        self._rewritten(request)

    def free_beyond(self, request: Request, num_tokens: int) -> list[int]:
        """Give back the tail blocks that hold none of the first `num_tokens` tokens (the
        slots of rejected draft tokens); returns their ids."""
        keep = self.blocks_needed(num_tokens)
        given_back = []
        if any(len(table) > keep for table in request.block_tables):
            self._rewritten(request)
        for table in request.block_tables:  # every KV group's table
            tail = table[keep:]
            del table[keep:]
            for block_id in reversed(tail):
                if block_id != NO_BLOCK:
                    self._release(block_id)
                    given_back.append(block_id)
        self.num_held_entries -= len(given_back)
        del request.block_hashes[keep:]
        return given_back

    def reset_prefix_cache(self) -> None:
        if self.tiers is not None:
            self.tiers.reset()
        for block_id in list(self.evictable):
            self._drop_hash(self.blocks[block_id])
            self.free_uncached.append(block_id)
        self.evictable.clear()

    # ---- internals -----------------------------------------------------------------
    def _rewritten(self, request: Request) -> None:
        """A table changed other than by appending: the runner copies it again whole."""
        request.table_epoch += 1
        if self.track_changes:
            self.changed.append(request)

    def _block_hashes(self, request: Request, num_blocks: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """(chained hash, token ids) of the request's first `num_blocks` blocks, lazily."""
        tokens = request.all_token_ids
        parent = _root_hash(request)
        for i in range(num_blocks):
            ids = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            parent = chain_hash(parent, ids)
            yield parent, ids

    def _lookup(self, group: int, h: int, ids: tuple[int, ...]) -> int | None:
        block_id = self.hash_to_block.get((group, h))
        if block_id is None or self.blocks[block_id].token_ids != ids:
            return None
        return block_id

    def _longest_window_hit(self, hits: list[list[int | None]], num_blocks: int) -> int:
        """The largest n <= num_blocks whose last blocks each windowed group's next query
        sees are cached in that group (all of [0, n) when the window reaches further)."""
        runs = []  # per windowed group: cached blocks in a row ending at each index
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            run, count = [], 0
            for block_id in hits[g][:num_blocks]:
                count = count + 1 if block_id is not None else 0
                run.append(count)
            runs.append((cdiv(window - 1, self.block_size), run))
        for n in range(num_blocks, 0, -1):
            if all(run[n - 1] >= min(n, needed) for needed, run in runs):
                return n
        return 0

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.evictable[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block_id} freed twice")
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None:
                self.evictable[block_id] = None
            else:
                self.free_uncached.append(block_id)

    def _pop_free_block(self) -> int:
        if self.free_uncached:
            block_id = self.free_uncached.popleft()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self.tiers is not None:  # the host tier keeps its KV (copied before it is reused)
                self.tiers.evicted(block_id, block.hash, block.token_ids)
            self._drop_hash(block)
        block = self.blocks[block_id]
        block.ref_count = 1
        return block_id

    def _drop_hash(self, block: Block) -> None:
        key = (block.group, block.hash)
        if block.hash is not None and self.hash_to_block.get(key) == block.block_id:
            del self.hash_to_block[key]
        block.hash, block.token_ids = None, None
