"""`kvdeck bench decode --contention N`: the same decode on a quiet machine and with N other
processes each keeping one CPU busy, in turns, and each side's busy speed over its quiet speed.

A workstation always runs something else (a compiler, a browser). The busy loops are plain
Python processes, one pinned to each of the last N CPUs this process may use
(os.sched_setaffinity), started before a busy turn and stopped after it whatever happens (an
error, ctrl+c): `BusyLoops` is a context manager, and a loop whose parent is gone stops by
itself. Both conditions wait `settle_s` before their timed runs, so the engine's thread
governor (engine/runner/cpu_threads.py, which reads the load every half second) sees the load
as it is, as it would on a machine already busy when a request arrives.

Turns: repeat i runs quiet then busy (busy then quiet on odd repeats), and inside each
condition kvdeck and the baseline in turns as kvdeck.app.bench.pairs does; the ratio of a side
is, repeat by repeat, its quiet time per token over its busy time per token (busy tokens/s
over quiet tokens/s: 1.0 means the busy core costs nothing, 0.5 half the speed).
"""

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from kvdeck.app.bench.pairs import ratio_summary

SETTLE_S = 1.0  # twice the thread governor's interval
CONDITIONS = ("quiet", "busy")
# The busy loop: spins until its parent (the benchmark) is gone, checking now and then.
BUSY_LOOP = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(2_000_000):
        pass
"""


def busy_cpus(count: int, allowed: set[int] | frozenset[int] | None = None) -> list[int]:
    """The CPUs the busy loops take: the last `count` of those this process may run on."""
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    if not 1 <= count <= len(cpus):
        raise ValueError(f"--contention must be between 1 and the {len(cpus)} CPUs this process "
                         f"may use, got {count}")
    return cpus[-count:]


@dataclass(slots=True)
class BusyLoops:
    """One busy-loop process per CPU in `cpus`, each pinned to it, while in the with-block."""

    cpus: list[int]
    python: str = sys.executable
    processes: list[subprocess.Popen] = field(default_factory=list)
    started: int = 0  # processes started, over the object's life
    stopped: int = 0  # ...and stopped

    def start(self) -> "BusyLoops":
        try:
            for cpu in self.cpus:
                process = subprocess.Popen([self.python, "-c", BUSY_LOOP, str(os.getpid())],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                self.processes.append(process)
                self.started += 1
                os.sched_setaffinity(process.pid, {cpu})
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every loop and reap it (safe to call twice)."""
        while self.processes:
            process = self.processes.pop()
            if process.poll() is None:
                process.kill()
            process.wait()
            self.stopped += 1

    def __enter__(self) -> "BusyLoops":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(slots=True)
class Contention:
    """The busy side of `kvdeck bench decode --contention N`."""

    cpus: list[int]
    settle_s: float = SETTLE_S
    make_loops: Callable[[list[int]], AbstractContextManager] = BusyLoops
    sleep: Callable[[float], None] = time.sleep

    @contextmanager
    def condition(self, name: str) -> Iterator[None]:
        """Quiet, or the busy loops running; either way `settle_s` passes before the runs."""
        with self.make_loops(self.cpus) if name == "busy" else nullcontext():
            self.sleep(self.settle_s)
            yield

    def turns(self, sides: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, list]]:
        """Each side's runs per condition: {side: {"quiet": [...], "busy": [...]}}, in turns."""
        runs = {side: {name: [] for name in CONDITIONS} for side in sides}
        for index in range(repeats):
            for name in CONDITIONS if index % 2 == 0 else CONDITIONS[::-1]:
                with self.condition(name):
                    order = list(sides) if index % 2 == 0 else list(sides)[::-1]
                    for side in order:
                        runs[side][name].append(sides[side]())
        return runs

    def figures(self, seconds_per_token: dict[str, dict[str, list[float]]]) -> dict:
        """The JSON's `contention`: each side's runs and busy/quiet speed ratio."""
        import statistics

        result: dict[str, Any] = {"busy_processes": len(self.cpus), "busy_cpus": list(self.cpus),
                                  "settle_s": self.settle_s,
                                  "ratio": "busy tokens/s over quiet tokens/s, repeat by repeat"}
        for side, runs in seconds_per_token.items():
            quiet, busy = runs["quiet"], runs["busy"]
            result[side] = {
                "quiet_time_per_output_token_s": statistics.median(quiet),
                "busy_time_per_output_token_s": statistics.median(busy),
                "quiet_output_tokens_per_s": 1 / statistics.median(quiet),
                "busy_output_tokens_per_s": 1 / statistics.median(busy),
                "runs_quiet_time_per_output_token_s": quiet,
                "runs_busy_time_per_output_token_s": busy,
                "busy_over_quiet": ratio_summary([q / b for q, b in zip(quiet, busy, strict=True)]),
            }
        return result
