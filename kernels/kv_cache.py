"""Write this step's keys and values into the paged cache by slot mapping."""

import torch

from kvdeck.kernels.step_memo import StepMemo


def write_kv_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value: [num_tokens, num_kv_heads, head_dim]; slot = block_id * block_size + offset.

    Negative slots (padding tokens) are skipped.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    slots, keep = _step_slots.get((slot_mapping,), (), lambda: _valid_slots(slot_mapping))
    if keep is not None:
        key, value = key[keep], value[keep]
    flat_k.index_copy_(0, slots, key.to(k_cache.dtype))
    flat_v.index_copy_(0, slots, value.to(v_cache.dtype))


# Every layer writes to the same slots: find the padding rows once per step.
_step_slots: StepMemo[tuple[torch.Tensor, torch.Tensor | None]] = StepMemo()


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(slots to write, which token rows they belong to; None when all of them)."""
    slots = slot_mapping.long()
    if not bool((slots < 0).any()):
        return slots, None
    keep = slots >= 0
    return slots[keep], keep
