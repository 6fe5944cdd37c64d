"""Classify every physical KV block of an EngineStats snapshot for the block map.

Pure data (no Textual), so the map widget only turns these arrays into strips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats

FREE, CACHED, OWNED, SHARED, WRITING, SPECULATIVE, ROLLED_BACK = range(7)
KIND_NAMES = ("free", "cached (evictable)", "owned", "shared (ref > 1)", "being written",
              "written speculatively (draft tokens verified this step)",
              "rolled back (held only rejected draft tokens, given back)")

@dataclass(slots=True)
class BlockCells:
    kinds: list[int]  # one of FREE..ROLLED_BACK per physical block
    owners: list[str | None]  # first request (in stats order) whose table holds the block
    ref_counts: list[int]

    @property
    def num_blocks(self) -> int:
        return len(self.kinds)


def classify_blocks(stats: EngineStats) -> BlockCells:
    num_blocks = stats.num_blocks
    refs = list(stats.block_ref_counts[:num_blocks])
    refs.extend([0] * (num_blocks - len(refs)))
    cached = stats.block_is_cached
    owners: list[str | None] = [None] * num_blocks
    for request in stats.requests:
        rid = request.request_id
        # Hybrid models list a table per KV group; released window entries are -1.
        for table in request.block_tables or [request.block_table]:
            for block in table:
                if 0 <= block < num_blocks and owners[block] is None:
                    owners[block] = rid
    kinds = [
        (SHARED if ref > 1 else OWNED) if ref > 0
        else (CACHED if i < len(cached) and cached[i] else FREE)
        for i, ref in enumerate(refs)
    ]
    for block in stats.blocks_written_last_step:
        if 0 <= block < num_blocks and refs[block] > 0:
            kinds[block] = WRITING
    spec = stats.spec
    if spec is not None:
        # Speculation marks over "written": which blocks took draft K/V, and (a one-snapshot
        # flash) which were given back because they held only rejected drafts.
        for block in {slot // stats.block_size for slot in spec.slots_written_last_step}:
            if 0 <= block < num_blocks and refs[block] > 0:
                kinds[block] = SPECULATIVE
        for block in spec.blocks_rolled_back_last_step:
            if 0 <= block < num_blocks and refs[block] == 0:
                kinds[block] = ROLLED_BACK
    return BlockCells(kinds, owners, refs)
