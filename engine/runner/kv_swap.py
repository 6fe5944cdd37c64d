"""Host swap space's contents and each step's swap copies (swap preemption, engine/core/swap.py).

The core numbers the host slots; here they are rows of one host buffer (pinned on CUDA). A
step's copies run before its forward, outside any CUDA graph, in an order that lets the
scheduler reuse in the same step both the device blocks a swap-out releases and the host
slots a swap-in gives back:
1. gather the swap-outs' device blocks (before anything writes a released block);
2. read the swap-ins' host slots (before a swap-out overwrites a released slot);
3. store the gathered blocks in their host slots;
4. scatter the swapped-in rows into their new device blocks.
Each is one batched copy per cache tensor (kv_block_copy.py).
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvdeck.engine.runner.kv_block_copy import HostKVBlocks, KVBlockCopier


@dataclass(slots=True)
class SwapCopyTimes:
    out_s: float = 0.0  # steps 1 and 3
    in_s: float = 0.0  # steps 2 and 4 (on CUDA: enqueued; the forward after it waits for it)


@dataclass(slots=True)
class KVSwapper:
    copier: KVBlockCopier
    host: HostKVBlocks
    # The copies' times per scheduler step, until the core collects them (async scheduling
    # resolves a step after the next one was launched).
    step_times: dict[int, SwapCopyTimes] = field(default_factory=dict)
    blocks_out: int = 0
    blocks_in: int = 0

    @classmethod
    def for_pool(cls, copier: KVBlockCopier, num_slots: int) -> "KVSwapper":
        return cls(copier, copier.allocate_host(num_slots))

    @property
    def num_slots(self) -> int:
        return self.host.num_blocks

    def copy(self, step: int, swap_out: Sequence[tuple[int, int]],
             swap_in: Sequence[tuple[int, int]]) -> None:
        """`swap_out`: (device block, host slot) pairs; `swap_in`: (host slot, device block)."""
        if not swap_out and not swap_in:
            return
        times = SwapCopyTimes()
        started = time.perf_counter()
        gathered = self.copier.gather_blocks([block for block, _ in swap_out]) if swap_out else None
        gathered_at = time.perf_counter()
        incoming = self.host.take([slot for slot, _ in swap_in]) if swap_in else None
        taken_at = time.perf_counter()
        if gathered is not None:
            self.host.put([slot for _, slot in swap_out], gathered)
        stored_at = time.perf_counter()
        if incoming is not None:
            self.copier.scatter_blocks([block for _, block in swap_in], incoming)
        times.out_s = (gathered_at - started) + (stored_at - taken_at)
        times.in_s = (taken_at - gathered_at) + (time.perf_counter() - stored_at)
        self.blocks_out += len(swap_out)
        self.blocks_in += len(swap_in)
        self.step_times[step] = times

    def take_times(self, step: int) -> SwapCopyTimes | None:
        return self.step_times.pop(step, None)
