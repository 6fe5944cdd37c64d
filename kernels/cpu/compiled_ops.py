"""The torch KV write and paged attention as one registered op, for torch.compile.

Compiled, a decode forward keeps each layer's attention as one opaque call (as vLLM does):
inside, the attention plans the step on the host and its context length changes every
step, which a compiled graph would otherwise have to recompile for. The op declares that it
writes the caches, so the compiler neither copies them nor moves the write after a read
(its reinplacing pass makes the functionalised call in-place again).

Registered with `torch.library.Library` rather than `torch.library.custom_op`: the latter
wraps each call in Python layers that cost about 6-8 us a call against 4 (measured on the
2-core EPYC), and a 30-layer model calls it 30 times a step.
"""

import torch

from kvdeck.kernels.cpu.ops import paged_attention_torch_backend
from kvdeck.kernels.reference.kv_cache import write_kv_cache_torch

_LIBRARY = torch.library.Library("kvdeck", "FRAGMENT")
_LIBRARY.define(
    "paged_attention_with_kv_write(Tensor q, Tensor key, Tensor value, Tensor(a!) k_cache, "
    "Tensor(b!) v_cache, Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, "
    "Tensor seq_lens, float scale, int max_query_len, int max_seq_len) -> Tensor"
)


def _paged_attention_with_kv_write(q, key, value, k_cache, v_cache, slot_mapping, block_tables,
                                   query_start_loc, seq_lens, scale, max_query_len, max_seq_len):
    write_kv_cache_torch(key, value, k_cache, v_cache, slot_mapping)
    return paged_attention_torch_backend(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                                         scale, max_query_len, max_seq_len)


_LIBRARY.impl("paged_attention_with_kv_write", _paged_attention_with_kv_write, "CPU")


@torch.library.register_fake("kvdeck::paged_attention_with_kv_write")
def _(q, key, value, k_cache, v_cache, slot_mapping, block_tables, query_start_loc, seq_lens, scale,
      max_query_len, max_seq_len):
    return torch.empty_like(q)


def paged_attention_with_kv_write(q, key, value, k_cache, v_cache, slot_mapping, block_tables,
                                  query_start_loc, seq_lens, scale: float, max_query_len: int,
                                  max_seq_len: int) -> torch.Tensor:
    """Write this step's K/V into the caches, then attend over them (the torch reference)."""
    return torch.ops.kvdeck.paged_attention_with_kv_write(
        q, key, value, k_cache, v_cache, slot_mapping, block_tables, query_start_loc, seq_lens, scale,
        max_query_len, max_seq_len)
