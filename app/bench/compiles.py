"""No figure with a kernel compile in it: a timed run during which the engine compiled a
kernel variant (about a second on a GPU, engine/runner/warmup.py says why none should) is
run again, and a second such run is refused."""

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class CompilesInTimedWindow(ValueError):
    """Kernel compiles inside a timed window, twice over."""


def kernel_compiles(llm) -> int:
    """The engine process's kernel compiles so far (its stats)."""
    return llm.engine.stats().kernel_compiles_total


def timed_without_compiles(llm, run: Callable[[], T], what: str) -> tuple[T, int]:
    """`run()`'s result from a run without kernel compiles, and how many runs were discarded
    for having some (0 or 1); CompilesInTimedWindow when the rerun compiles too."""
    for discarded in range(2):
        before = kernel_compiles(llm)
        result = run()
        compiled = kernel_compiles(llm) - before
        if compiled == 0:
            return result, discarded
    raise CompilesInTimedWindow(
        f"{compiled} kernel variants compiled inside the timed window of {what}, in a run and in "
        "its rerun: the start-up warm-up missed them (engine/runner/warmup.py); no figure is "
        "reported")
