"""Building blocks shared by the decoder-only model families."""

from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.kernels.dispatch import KernelOps
from kvdeck.kernels.torch_custom_ops import paged_attention_with_kv_write


@dataclass(slots=True)
class AttentionMetadata:
    """The packed batch's layout, shared by every attention layer in one forward."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    max_query_len: int
    max_seq_len: int


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class PagedAttention(nn.Module):
    """Writes this step's K/V into the paged cache, then attends over the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.ops = ops
        # Set by the model runner once the pool is allocated.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if torch.compiler.is_compiling():  # one opaque call per layer (compiled_forward.py)
            return paged_attention_with_kv_write(
                q, k, v, self.k_cache, self.v_cache, meta.slot_mapping, meta.block_tables,
                meta.query_start_loc, meta.seq_lens, self.scale, meta.max_query_len, meta.max_seq_len)
        self.ops.write_kv_cache(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        return self.ops.paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            self.scale,
            meta.max_query_len,
            meta.max_seq_len,
        )
