"""Building blocks shared by the decoder-only model families."""

from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.kernels.cpu.compiled_ops import paged_attention_with_kv_write
from kvdeck.kernels.ops import KernelOps


@dataclass(slots=True)
class AttentionMetadata:
    """The packed batch's layout, shared by every attention layer in one forward."""

    slot_mapping: torch.Tensor  # [num_tokens] int64 (KV group 0)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32 (KV group 0)
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    max_query_len: int
    max_seq_len: int
    # Hybrid models (engine/types/kv_groups.py): (slot_mapping, block_tables) of groups 1...
    other_groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()

    def group(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot_mapping, block_tables) of KV group `index`."""
        return (self.slot_mapping, self.block_tables) if index == 0 else self.other_groups[index - 1]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class PagedAttention(nn.Module):
    """Writes this step's K/V into the paged cache, then attends over the cache.

    `sliding_window`: the keys a query sees (None: all); `soft_cap`: Gemma 2's score cap;
    `scale`: the score scale when it is not head_dim ** -0.5.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, ops: KernelOps,
                 sliding_window: int | None = None, soft_cap: float | None = None,
                 scale: float | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.ops = ops
        self.sliding_window = sliding_window
        self.soft_cap = soft_cap
        # Set by the model runner once the pool is allocated (`engine/runner/kv_pool.py`).
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.kv_group = 0
        # What the kernels need beyond plain causal attention over a float cache (the
        # window, the cap, an 8-bit cache's scales); empty for most layers.
        self.write_options: dict = {}
        self.attend_options: dict = {}

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        slot_mapping, block_tables = meta.group(self.kv_group)
        if torch.compiler.is_compiling():  # one opaque call per layer (compiled_forward.py);
            # compile_decode refuses layers with options (windows, caps, 8-bit caches)
            return paged_attention_with_kv_write(
                q, k, v, self.k_cache, self.v_cache, slot_mapping, block_tables,
                meta.query_start_loc, meta.seq_lens, self.scale, meta.max_query_len, meta.max_seq_len)
        self.ops.write_kv_cache(k, v, self.k_cache, self.v_cache, slot_mapping, **self.write_options)
        return self.attend(q, meta)

    def forward_fused(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                      meta: AttentionMetadata, q_norm: "RMSNorm | None" = None,
                      k_norm: "RMSNorm | None" = None) -> torch.Tensor:
        """q/k norm (when given) + RoPE + this step's K/V write in the backend's one fused
        launch (`KernelOps.qk_norm_rope_kv_write`), then attention. q/k may be rewritten in
        place: strided views of the qkv buffer."""
        slot_mapping, _ = meta.group(self.kv_group)
        norms = (q_norm.weight, k_norm.weight, q_norm.eps) if q_norm is not None else ()
        q, _ = self.ops.qk_norm_rope_kv_write(positions, q, k, v, cos_sin_cache, is_neox,
                                              self.k_cache, self.v_cache, slot_mapping, *norms,
                                              **self.write_options)
        return self.attend(q, meta)

    def attend(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention over the cache (this step's K/V already written)."""
        _, block_tables = meta.group(self.kv_group)
        return self.ops.paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            self.scale,
            meta.max_query_len,
            meta.max_seq_len,
            **self.attend_options,
        )
