"""KV cache groups: which layers share a block table (vLLM v1's hybrid allocator, simplified).

Layers that see the same span of keys (every earlier key, or the same sliding window) can
share one block table per request. A model whose layers all see the same span is one group
holding every layer, and a block is one slot per layer: kvdeck's plain paged cache. A
hybrid model (Gemma 2 and 3: local layers with a window, global ones without) gets a group
per span, so a request's local-layer blocks can be released once they slide out of the
window while its global-layer blocks stay.

Every block of the one shared pool has the same size: `slots_per_block` layer slots. So
that a block fits any group, the layers of each span are split into groups of about the
same size (vLLM's rule: the smallest span's layer count, or the largest when the counts
are within 25%); a group with fewer layers leaves slots unused (padding, reported).
Layer `layers[j]` of a group stores its K/V in storage slot j of the group's blocks.

Light (no torch): the core, the runner and the stats all read it.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kvdeck.engine.types.arith import cdiv


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    window: int | None  # keys a query sees (transformers' sliding_window); None: all of them
    layers: tuple[int, ...]  # model layer indices; layers[j] uses storage slot j


def kv_cache_groups(layer_windows: Sequence[int | None]) -> list[KVCacheGroup]:
    """Groups for a model whose layer i sees `layer_windows[i]` keys (None: all); full
    attention first, then windows from the smallest."""
    if not layer_windows:
        raise ValueError("a model needs at least one attention layer")
    spans = sorted(set(layer_windows), key=lambda w: (w is not None, w or 0))
    layers_of = {span: [i for i, w in enumerate(layer_windows) if w == span] for span in spans}
    counts = [len(layers) for layers in layers_of.values()]
    group_size = min(counts)
    if max(counts) < 1.25 * group_size:  # few padding slots even at the largest count
        group_size = max(counts)
    groups = []
    for span in spans:
        layers = layers_of[span]
        num_groups = cdiv(len(layers), group_size)
        groups += [KVCacheGroup(span, tuple(layers[i::num_groups])) for i in range(num_groups)]
    return groups


def slots_per_block(groups: Sequence[KVCacheGroup]) -> int:
    """Layer slots in one block of the pool (the largest group's layer count)."""
    return max(len(g.layers) for g in groups)


def peak_blocks(groups: Sequence[KVCacheGroup], num_tokens: int, block_size: int,
                chunk_tokens: int) -> int:
    """The most blocks one request of `num_tokens` holds at once, computing at most
    `chunk_tokens` per step: a windowed group holds its window's blocks plus one chunk's."""
    total = 0
    for group in groups:
        blocks = cdiv(num_tokens, block_size)
        if group.window is not None:
            blocks = min(blocks, cdiv(group.window - 1 + chunk_tokens, block_size) + 1)
        total += blocks
    return total
