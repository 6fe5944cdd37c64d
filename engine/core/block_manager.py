"""The paged KV cache's bookkeeping: a pool of fixed-size blocks, per-request block
tables, reference counts, and automatic prefix caching.

A full block is identified by a chained hash of (parent block's hash, its token ids);
the ids are stored too, so a hash collision is caught by comparing them. Blocks whose
last owner finished keep their hash and stay reusable until they are evicted, least
recently freed first. Blocks that hold no reusable prefix are handed out before any
cached block is evicted.
"""

from collections import OrderedDict, deque
from dataclasses import dataclass

from kvdeck.engine.core.request import Request
from kvdeck.engine.types.arith import cdiv

_ROOT_HASH = -1


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] | None = None


def chain_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 0, LRU first
        self.hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ---- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- prefix cache ------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> tuple[list[int], list[int]]:
        """The longest run of cached full blocks matching the request's tokens.

        The last token is never served from the cache: its logits are needed.
        Returns (block ids, their chained hashes).
        """
        if not self.enable_prefix_caching:
            return [], []
        tokens = request.all_token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        block_ids: list[int] = []
        hashes: list[int] = []
        parent = _ROOT_HASH
        for i in range(max_blocks):
            ids = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, ids)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != ids:
                break
            block_ids.append(block_id)
            hashes.append(h)
            parent = h
        return block_ids, hashes

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    # ---- allocation ----------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        cached_block_ids: list[int] | None = None,
        cached_hashes: list[int] | None = None,
    ) -> bool:
        """Make the block table cover num_computed_tokens (+ cached hits) + num_new_tokens.

        Returns False, changing nothing, when the pool cannot supply the blocks.
        """
        cached_block_ids = cached_block_ids or []
        num_computed = request.num_computed_tokens + len(cached_block_ids) * self.block_size
        total_needed = self.blocks_needed(num_computed + num_new_tokens)
        num_new_blocks = total_needed - len(request.block_table) - len(cached_block_ids)
        # Touching an evictable hit takes it out of the free pool.
        reclaimed = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        if num_new_blocks > self.num_free_blocks - reclaimed:
            return False
        for block_id in cached_block_ids:
            self._touch(block_id)
        request.block_table.extend(cached_block_ids)
        request.block_hashes.extend(cached_hashes or [])
        for _ in range(max(num_new_blocks, 0)):
            request.block_table.append(self._pop_free_block())
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Register every block whose tokens are all computed under its chained hash."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        parent = request.block_hashes[-1] if request.block_hashes else _ROOT_HASH
        for i in range(len(request.block_hashes), num_full):
            ids = tuple(
                request.token_id_at(p) for p in range(i * self.block_size, (i + 1) * self.block_size)
            )
            h = chain_hash(parent, ids)
            request.block_hashes.append(h)
            parent = h
            block = self.blocks[request.block_table[i]]
            if h not in self.hash_to_block and block.hash is None:
                block.hash, block.token_ids = h, ids
                self.hash_to_block[h] = block.block_id

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so shared prefixes are evicted last."""
        for block_id in reversed(request.block_table):
            self._release(block_id)
        request.block_table = []
        request.block_hashes = []

    def free_beyond(self, request: Request, num_tokens: int) -> list[int]:
        """Give back the tail blocks that hold none of the first `num_tokens` tokens (the
        slots of rejected draft tokens); returns their ids."""
        keep = self.blocks_needed(num_tokens)
        tail = request.block_table[keep:]
        if not tail:
            return []
        del request.block_table[keep:]
        del request.block_hashes[keep:]
        for block_id in reversed(tail):
            self._release(block_id)
        return tail

    def reset_prefix_cache(self) -> None:
        for block_id in list(self.evictable):
            self._drop_hash(self.blocks[block_id])
            self.free_uncached.append(block_id)
        self.evictable.clear()

    # ---- internals -----------------------------------------------------------------
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

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.evictable[block_id]
        block.ref_count += 1

    def _pop_free_block(self) -> int:
        if self.free_uncached:
            block_id = self.free_uncached.popleft()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            self._drop_hash(self.blocks[block_id])
        block = self.blocks[block_id]
        block.ref_count = 1
        return block_id

    def _drop_hash(self, block: Block) -> None:
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids = None, None
