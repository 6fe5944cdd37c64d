"""`kvdeck bench` reports no figure with a kernel compile in its timed window: such a run is
run again, and refused if the rerun compiles too."""

from types import SimpleNamespace

import pytest

from kvdeck.app.bench.compiles import CompilesInTimedWindow, timed_without_compiles


class FakeLLM:
    """An engine whose kernel compile count moves by `compiles[i]` during the i-th run."""

    def __init__(self, compiles: list[int]) -> None:
        self.total, self.compiles, self.runs = 0, list(compiles), 0
        self.engine = SimpleNamespace(stats=lambda: SimpleNamespace(kernel_compiles_total=self.total))

    def run(self) -> str:
        self.total += self.compiles[self.runs]
        self.runs += 1
        return f"figure {self.runs}"


def test_a_run_without_compiles_is_kept():
    llm = FakeLLM([0])
    assert timed_without_compiles(llm, llm.run, "bench") == ("figure 1", 0)


def test_a_run_with_compiles_is_run_again():
    llm = FakeLLM([2, 0])
    assert timed_without_compiles(llm, llm.run, "bench") == ("figure 2", 1)


def test_compiles_in_the_rerun_refuse_the_figure():
    llm = FakeLLM([1, 3])
    with pytest.raises(CompilesInTimedWindow, match="3 kernel variants compiled inside the timed window"):
        timed_without_compiles(llm, llm.run, "bench throughput")
    assert llm.runs == 2
