"""The CPU engine's thread count follows the cores other processes leave free
(engine/runner/cpu_threads.py), re-checked while it runs, and keeps a count the user set."""

import pytest

from kvdeck import LLM
from kvdeck.engine.runner import cpu_threads
from kvdeck.engine.runner.cpu_threads import CpuTimes, ThreadGovernor

CORES = frozenset({0, 1})


class FakeMachine:
    """/proc as a test says: each `advance` is half a second on two cores, `others` of them
    kept busy by other processes and `own` by this one."""

    def __init__(self) -> None:
        self.times = CpuTimes(0, 0, 0)
        self.now = 0.0

    def advance(self, others: float, own: float) -> None:
        per_core = 50  # jiffies in half a second
        self.times = CpuTimes(self.times.elapsed + 2 * per_core,
                              self.times.busy + round((others + own) * per_core),
                              self.times.own + round(own * per_core))
        self.now += cpu_threads.INTERVAL_S

    def read(self, cores):
        assert cores == CORES
        return self.times


def governor(machine: FakeMachine, most: int = 2) -> ThreadGovernor:
    return ThreadGovernor(most, pinned=False, cores=CORES, read=machine.read, clock=lambda: machine.now)


@pytest.mark.parametrize("others,expected", [(0.0, 2), (0.2, 2), (0.5, 1), (1.0, 1), (2.0, 1)])
def test_the_team_gives_up_the_cores_others_use(others, expected):
    machine = FakeMachine()
    threads = governor(machine)
    machine.advance(others=others, own=2.0 - min(others, 1.0))
    assert threads.threads() == expected


def test_it_follows_the_load_while_running_and_only_every_interval():
    machine = FakeMachine()
    threads = governor(machine)
    assert threads.threads() == 2
    machine.advance(others=1.0, own=1.0)  # a compiler starts
    assert threads.threads() == 1
    reads = []
    threads._read = lambda cores: reads.append(cores) or machine.read(cores)
    assert threads.threads() == 1 and reads == []  # no half second has passed: not read again
    machine.advance(others=0.0, own=1.0)  # it stopped
    assert threads.threads() == 2


def test_a_count_the_user_set_is_kept(monkeypatch):
    pinned = ThreadGovernor.for_engine(3, default=2)
    assert pinned.pinned and pinned.threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ThreadGovernor.for_engine(None, default=2).pinned
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert not ThreadGovernor.for_engine(None, default=2).pinned


def test_no_proc_keeps_the_count():
    threads = ThreadGovernor(2, pinned=False, cores=CORES, read=lambda cores: None, clock=lambda: 10.0)
    assert threads.threads() == 2


def test_the_real_counters_read():
    times = cpu_threads.read_cpu_times(frozenset(range(64)))
    assert times is None or (times.elapsed > 0 and 0 <= times.busy <= times.elapsed and times.own >= 0)


def test_the_engine_applies_the_configured_count(tiny_llama_dir):
    import torch

    before = torch.get_num_threads()
    try:
        llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01, cpu_threads=1)
        llm.generate([[5, 6, 7]])
        assert torch.get_num_threads() == 1 and llm.engine.core.runner.cpu_threads.pinned
        with pytest.raises(ValueError, match="cpu_threads"):
            LLM(str(tiny_llama_dir), cpu_threads=0)
    finally:
        torch.set_num_threads(before)
