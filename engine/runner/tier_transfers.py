"""A step's copies for the prefix cache's host and disk tiers: made by the core's KVTiers
(`engine/core/kv_tiers.py`), carried on the scheduled batch, done by the runner's KVTierIO
(`kv_tier_io.py`) before the forward. Plain lists: the scheduler that carries them imports
no torch."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class TierTransfers:
    # Saved first, before anything in the step writes the pool: host row -> the evicted device
    # block whose KV goes there.
    offload: dict[int, int] = field(default_factory=dict)
    # Then copied in: (host row, device block) from the host tier, and per admitted request
    # (device blocks, their bytes read from disk: one block after another).
    host_loads: list[tuple[int, int]] = field(default_factory=list)
    disk_loads: list[tuple[list[int], bytearray]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.offload or self.host_loads or self.disk_loads)
