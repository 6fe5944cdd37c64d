"""Logits at every position of one token sequence, computed through the paged KV cache, for
quality measurements (perplexity per KV dtype): the keys and values a position attends to
are read back from the cache, so an 8-bit cache's rounding is in the result.

Uses blocks 0.. of the pool directly: only for an engine with nothing running (an
evaluation script's own engine), never beside the scheduler.
"""

import torch

from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.types.arith import cdiv


@torch.inference_mode()
def sequence_logits(runner, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] fp32 logits; the sequence is one prefill (one chunk)."""
    num_tokens = len(token_ids)
    device, block_size = runner.device, runner.block_size
    blocks = cdiv(num_tokens, block_size)
    num_groups = len(runner.kv_pool.groups)
    if blocks * num_groups > runner.num_blocks:
        raise ValueError(f"{num_tokens} tokens need {blocks * num_groups} blocks; the pool has "
                         f"{runner.num_blocks}")
    positions = torch.arange(num_tokens, device=device)
    group_tensors = []
    for group in range(num_groups):  # each KV group its own blocks
        table = torch.arange(group * blocks, (group + 1) * blocks, dtype=torch.int32, device=device)
        slots = table.long().repeat_interleave(block_size)[:num_tokens] * block_size \
            + positions % block_size
        group_tensors.append((slots, table[None]))
    meta = AttentionMetadata(
        slot_mapping=group_tensors[0][0], block_tables=group_tensors[0][1],
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        max_query_len=num_tokens, max_seq_len=num_tokens, other_groups=tuple(group_tensors[1:]),
    )
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    hidden = runner.model(ids, positions, meta)
    return runner.model.compute_logits(hidden).float()
