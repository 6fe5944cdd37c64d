"""Swap preemption (vLLM v0's `preemption_mode="swap"`): a preempted request's KV blocks are
copied to host swap space instead of being dropped, and copied back when it resumes, so it
goes on decoding without recomputing its prompt and output.

Order of events, all in one step: the scheduler picks the victim, `swap_out` records each of
its device blocks with a host slot in the batch (`blocks_to_swap_out`) and releases the
victim's references at once, so the same schedule may hand those blocks to another request.
That is safe because the runner copies every swap-out before the step's forward writes any
K/V (`engine/runner/kv_swap.py`). A block the victim shares with others (a prefix-cache hit,
ref count > 1) is copied too, and only loses the victim's reference: the others keep it.

Resuming (`swap_in`) takes fresh device blocks in the same table layout (a sliding window's
released entries stay released), records them in `blocks_to_swap_in` and gives the host
slots back: the runner reads the host slots before any swap-out of the same step writes
them, and writes the device blocks after the swap-outs read theirs.

`auto` (the default) swaps a victim with at least `swap_min_tokens` computed tokens while
the swap space has room, and recomputes the rest: below that, recomputing costs about what
the copies do (docs/architecture/kv-cache.md, benchmarks/bench_swap_preemption.py).
"""

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.host_block_pool import HostBlockPool
from kvdeck.engine.core.request import NO_BLOCK, Request, RequestStatus
from kvdeck.engine.types.config import PREEMPTION_MODES, EngineConfig
from kvdeck.engine.types.stats import StepTimings

if TYPE_CHECKING:
    from kvdeck.engine.core.scheduler import ScheduledBatch
    from kvdeck.engine.runner.kv_swap import KVSwapper
    from kvdeck.engine.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# auto's threshold in computed tokens: one block. Measured on the CPU with SmolLM2-135M
# (benchmarks/results/swap_preemption_smollm2_cpu.json), a swap-out plus swap-in costs less
# than recomputing at every length from 8 tokens on (1.5 ms against 13 ms as 8 tokens' share of
# a batch's prefill, 12 ms against 0.45 s at 256). One block, not zero: below it the saving is
# a few ms at most, and on a GPU (copies over PCIe, a far faster prefill) recompute gains.
SWAP_MIN_TOKENS = 16


@dataclass(slots=True)
class SwappedKV:
    """Where a swapped-out request's K/V waits: its tables' shape and a host slot per block."""

    layout: list[list[bool]]  # per KV group, per table entry: held a block (False: NO_BLOCK)
    slots: list[int]  # host slot of each held block, group by group in table order
    nbytes: int


@dataclass(slots=True)
class SwapCounters:
    swap_outs: int = 0  # requests swapped out
    swap_ins: int = 0
    blocks_out: int = 0
    blocks_in: int = 0
    recomputed: int = 0  # preemptions that recomputed (mode, length or no room)


@dataclass(slots=True)
class SwapSpace:
    block_manager: BlockManager
    host: HostBlockPool
    mode: str  # auto | swap | recompute
    block_bytes: int  # one block's K/V on the host
    min_tokens: int = SWAP_MIN_TOKENS
    swapped: dict[str, SwappedKV] = field(default_factory=dict)  # request id -> its swapped K/V
    counters: SwapCounters = field(default_factory=SwapCounters)
    # Per scheduler step: the requests swapped out and in by it, and their bytes, until the
    # runner's copy times for that step are shared out among them (`collect`).
    pending: dict[int, tuple[list[tuple[Request, int]], list[tuple[Request, int]]]] = field(
        default_factory=dict)
    seconds_out: float = 0.0
    seconds_in: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.mode!r}")

    def holds(self, request: Request) -> bool:
        return request.request_id in self.swapped

    def swap_out(self, request: Request, batch: "ScheduledBatch") -> int:
        """Swap the request's blocks out if the policy and the space allow; the bytes copied
        (0: it was not swapped and still holds its blocks)."""
        held = [b for table in request.block_tables for b in table if b != NO_BLOCK]
        if self.mode == "recompute" or not held or (
                self.mode == "auto" and request.num_computed_tokens < self.min_tokens):
            self.counters.recomputed += 1
            return 0
        slots = self.host.allocate(len(held))
        if slots is None:
            self.counters.recomputed += 1
            return 0
        layout = [[b != NO_BLOCK for b in table] for table in request.block_tables]
        batch.blocks_to_swap_out.extend(zip(held, slots, strict=True))
        nbytes = len(held) * self.block_bytes
        self.swapped[request.request_id] = SwappedKV(layout, slots, nbytes)
        self.block_manager.free(request)  # only its references: shared blocks stay with the others
        self.counters.swap_outs += 1
        self.counters.blocks_out += len(held)
        self._pending(batch.step)[0].append((request, nbytes))
        return nbytes

    def swap_in(self, request: Request, batch: "ScheduledBatch", num_new_tokens: int) -> bool:
        """Give the request device blocks for its swapped K/V and its next tokens, and record
        the copies; False (nothing changes) when the pool cannot supply them now."""
        record = self.swapped[request.request_id]
        manager = self.block_manager
        total = manager.blocks_needed(request.num_computed_tokens + num_new_tokens)
        needed = sum(sum(layout) + max(0, total - len(layout)) for layout in record.layout)
        if needed > manager.num_free_blocks:
            return False
        blocks = manager.restore_tables(request, record.layout)
        if not manager.allocate_slots(request, num_new_tokens):
            raise RuntimeError("blocks counted free were not")  # checked above
        batch.blocks_to_swap_in.extend(zip(record.slots, blocks, strict=True))
        self.host.free(record.slots)
        del self.swapped[request.request_id]
        self.counters.swap_ins += 1
        self.counters.blocks_in += len(blocks)
        self._pending(batch.step)[1].append((request, record.nbytes))
        return True

    def forget(self, request: Request) -> None:
        """A swapped-out request finished or was aborted: its host slots go back."""
        record = self.swapped.pop(request.request_id, None)
        if record is not None:
            self.host.free(record.slots)

    def cancel_swap_outs(self, batch: "ScheduledBatch") -> None:
        """A batch left empty never reaches the runner, so its swap-outs would never be copied:
        their requests recompute instead (a lone request always fits the pool, so this is a
        safety net rather than a path)."""
        for request in batch.preempted:
            if request.status is RequestStatus.SWAPPED and self.holds(request):
                self.forget(request)
                request.status = RequestStatus.PREEMPTED
                request.num_computed_tokens = 0
                self.counters.swap_outs -= 1
                self.counters.recomputed += 1
        batch.blocks_to_swap_out.clear()
        self.pending.pop(batch.step, None)

    def collect(self, step: int, kv_swap: "KVSwapper | None", timings: StepTimings) -> None:
        """The runner copied step `step`'s swaps: its times go into the step timings and, by
        bytes, into each swapped request's timeline."""
        requests = self.pending.pop(step, None)
        times = kv_swap.take_times(step) if kv_swap is not None else None
        if requests is None or times is None:
            return
        timings.swap_s += times.out_s + times.in_s
        self.seconds_out += times.out_s
        self.seconds_in += times.in_s
        for moved, seconds in zip(requests, (times.out_s, times.in_s), strict=True):
            total = sum(nbytes for _, nbytes in moved)
            for request, nbytes in moved:
                request.timeline.swap_copied(seconds * nbytes / total if total else 0.0)

    def _pending(self, step: int) -> tuple[list[tuple[Request, int]], list[tuple[Request, int]]]:
        return self.pending.setdefault(step, ([], []))


def available_host_bytes() -> int:
    """Memory the system can give without swapping (MemAvailable; free pages where unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def build_swap_space(config: EngineConfig, runner: "ModelRunner",
                     block_manager: BlockManager) -> SwapSpace | None:
    """The swap space `config` asks for, its host buffer allocated in the runner; None under
    preemption_mode="recompute" or swap_space=0. Its size: swap_space GiB, at most half the
    host memory available now and at most four device pools (more would never all be used
    by requests that each fit the pool; vLLM sizes it by swap_space alone)."""
    if config.preemption_mode == "recompute" or config.swap_space == 0:
        return None
    block_bytes = runner.kv_pool.bytes_per_block
    budget = min(int(config.swap_space * (1 << 30)), available_host_bytes() // 2)
    num_slots = min(budget // block_bytes, 4 * block_manager.num_blocks)
    if num_slots == 0:
        logger.warning("no host memory for swap space: preemption recomputes")
        return None
    runner.allocate_swap_space(num_slots)
    logger.info("swap space: %d blocks (%.2f GiB of host memory), preemption_mode=%s", num_slots,
                num_slots * block_bytes / (1 << 30), config.preemption_mode)
    return SwapSpace(block_manager, HostBlockPool(num_slots), config.preemption_mode, block_bytes)


def swap_stats_fields(swap: SwapSpace | None) -> dict[str, int | float]:
    """EngineStats' swap fields (zeros without swap space)."""
    if swap is None:
        return {}
    counters = swap.counters
    return {"host_swap_blocks_used": swap.host.num_used, "host_swap_blocks_total": swap.host.num_slots,
            "num_swapped": len(swap.swapped), "swap_outs_total": counters.swap_outs,
            "swap_ins_total": counters.swap_ins, "swap_out_blocks_total": counters.blocks_out,
            "swap_in_blocks_total": counters.blocks_in,
            "swap_seconds_total": swap.seconds_out + swap.seconds_in}
