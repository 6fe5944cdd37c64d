"""A step's KV copies outside the forward: the prefix cache's host / disk tiers (kv_tier_io.py)
and swap preemption (kv_swap.py), in the one order that lets the scheduler reuse, within the
step, the blocks and slots each of them releases:
1. tier saves: evicted blocks into host rows, before anything of the step writes the pool;
2. swaps: out, then in (kv_swap.py's own order), after the step before, before the forward;
3. tier loads: the host and disk tiers' hits into their blocks, after swap-outs read theirs.
Synchronous steps run all three before the forward; async scheduling runs them on the
device queue, 1 and 2 before the step's work starts and 3 inside it.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvdeck.engine.runner.kv_swap import KVSwapper
from kvdeck.engine.runner.kv_tier_io import KVTierIO
from kvdeck.engine.runner.tier_transfers import TierTransfers


@dataclass(slots=True)
class StepCopies:
    step: int = 0
    tiers: TierTransfers | None = None
    swap_out: Sequence[tuple[int, int]] = field(default_factory=list)  # (device block, host slot)
    swap_in: Sequence[tuple[int, int]] = field(default_factory=list)  # (host slot, device block)

    @classmethod
    def of(cls, batch: object) -> "StepCopies | None":
        """The scheduler's batch's copies, or None. Warm-up and draft batches have no such
        fields (the runner's BatchPlan protocol leaves them optional)."""
        tiers = getattr(batch, "tier_transfers", None)
        out = getattr(batch, "blocks_to_swap_out", None)
        back = getattr(batch, "blocks_to_swap_in", None)
        if tiers is None and not out and not back:
            return None
        # Copied now: the core's lists are reused for its next step before an async one runs.
        return cls(getattr(batch, "step", 0), tiers, list(out or ()), list(back or ()))

    @torch.inference_mode()
    def save_and_swap(self, tier_io: KVTierIO | None, swapper: KVSwapper | None) -> None:
        """Copies 1 and 2."""
        if self.tiers is not None and self.tiers.offload:
            tier_io.save(self.tiers)
        if self.swap_out or self.swap_in:
            if swapper is None:
                raise RuntimeError("the batch swaps KV blocks but the runner has no swap space")
            swapper.copy(self.step, self.swap_out, self.swap_in)

    @torch.inference_mode()
    def load(self, tier_io: KVTierIO | None) -> None:
        """Copy 3."""
        if self.tiers is not None and (self.tiers.host_loads or self.tiers.disk_loads):
            tier_io.load(self.tiers)
