"""How many threads the CPU engine's kernels use: as many as the cores other processes leave
free, re-checked while it runs.

Every kernel call is an OpenMP team that meets at a barrier, hundreds a decode step. When a
thread of the team shares its core with another busy process, the scheduler runs it only in
turns, and the whole team waits for it at every barrier: with one of two cores kept busy, a
2-thread decode of SmolLM2 ran at 30% of its quiet speed here (and 3.6% on another day),
where one thread keeps about 85% (benchmarks/results/cpu_contention_smollm2.json). So the
governor reads the CPU time the machine spent (/proc/stat, on the cores this process may run
on) and this process's own (/proc/self/stat) every half second; what the others used, in
cores, comes off the team. A thread count given by the user (`cpu_threads`, or
OMP_NUM_THREADS) is kept as it is.
"""

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

INTERVAL_S = 0.5  # how often the load is read again
# Others' use below this share of a core leaves the core to the engine (a shell, a monitor).
IDLE_SHARE = 0.25


@dataclass(slots=True)
class CpuTimes:
    """Jiffies: the cores' elapsed time (busy or not) and busy time, and this process's."""

    elapsed: int
    busy: int
    own: int


def read_cpu_times(cores: frozenset[int]) -> CpuTimes | None:
    """The counters now, for the given cores; None where /proc cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        with open("/proc/self/stat") as own:
            fields = own.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    elapsed = busy = 0
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        counts = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
        elapsed += sum(counts)
        busy += sum(counts) - counts[3] - counts[4]
    # utime and stime are fields 14 and 15 of /proc/self/stat (after the name: 12 and 13)
    return CpuTimes(elapsed, busy, int(fields[11]) + int(fields[12]))


class ThreadGovernor:
    """`threads()` before each step: the kernels' thread count for it."""

    def __init__(self, most: int, pinned: bool, cores: frozenset[int] | None = None,
                 read: Callable[[frozenset[int]], CpuTimes | None] = read_cpu_times,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.most = max(1, most)
        self.pinned = pinned
        self.cores = cores if cores is not None else _allowed_cores()
        self._read, self._clock = read, clock
        self._last = None if pinned else read(self.cores)
        self._checked = clock()
        self.current = self.most
        self.others = 0.0  # cores the other processes used in the last interval

    @classmethod
    def for_engine(cls, configured: int | None, default: int) -> "ThreadGovernor":
        """`configured`: the engine's cpu_threads; `default`: torch's thread count now (which
        OMP_NUM_THREADS, when set, already says: then pinned too)."""
        if configured is not None:
            return cls(configured, pinned=True)
        return cls(default, pinned="OMP_NUM_THREADS" in os.environ)

    def threads(self) -> int:
        if self.pinned or self._last is None or self._clock() - self._checked < INTERVAL_S:
            return self.current
        now = self._read(self.cores)
        self._checked = self._clock()
        if now is None:
            return self.current
        elapsed = now.elapsed - self._last.elapsed
        if elapsed > 0:
            per_core = elapsed / len(self.cores)
            self.others = max(0.0, (now.busy - self._last.busy) - (now.own - self._last.own)) / per_core
            free = len(self.cores) - math.ceil(self.others - IDLE_SHARE)
            chosen = max(1, min(self.most, free))
            if chosen != self.current:
                logger.info("CPU threads %d -> %d: other processes kept %.1f of %d cores busy",
                            self.current, chosen, self.others, len(self.cores))
                self.current = chosen
        self._last = now
        return self.current


def _allowed_cores() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))
