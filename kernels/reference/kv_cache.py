"""Write this step's keys and values into the paged cache by slot mapping."""

import torch

from kvdeck.kernels.reference.kv_quant import write_kv_rows
from kvdeck.kernels.reference.step_memo import StepMemo


def write_kv_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> None:
    """key/value: [num_tokens, num_kv_heads, head_dim]; slot = block_id * block_size + offset.

    Negative slots (padding tokens) are skipped. An 8-bit cache is quantised on the way in
    (`kernels.kv_quant`): fp8 by its per-tensor scale (a float), int8 with a scale per
    (token, head) written into `k_scale`/`v_scale` ([num_blocks, block_size, num_kv_heads]).
    """
    slots, keep = _step_slots.get((slot_mapping,), (), lambda: _valid_slots(slot_mapping))
    if keep is not None:
        key, value = key[keep], value[keep]
    if k_scale is None and k_cache.dtype == key.dtype:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value)
        return
    write_kv_rows(key, k_cache, slots, k_scale)
    write_kv_rows(value, v_cache, slots, v_scale)


# Every layer writes to the same slots: find the padding rows once per step.
_step_slots: StepMemo[tuple[torch.Tensor, torch.Tensor | None]] = StepMemo()


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(slots to write, which token rows they belong to; None when all of them)."""
    slots = slot_mapping.long()
    if not bool((slots < 0).any()):
        return slots, None
    keep = slots >= 0
    return slots[keep], keep
