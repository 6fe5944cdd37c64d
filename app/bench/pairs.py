"""Side-by-side runs: kvdeck and a baseline take turns on the same work, and each pair's
ratio is kept, so that a noisy machine (load that comes and goes) slows both sides of a
pair alike and shows up as spread rather than as a wrong median."""

import statistics
from collections.abc import Callable
from typing import Any


def alternate(kvdeck: Callable[[], Any], baseline: Callable[[], Any], repeats: int) -> list[tuple[Any, Any]]:
    """Run kvdeck, then the baseline, `repeats` times; the pairs in order. The side that goes
    first alternates, so neither always runs on a cache the other just warmed or cooled."""
    pairs = []
    for index in range(repeats):
        if index % 2 == 0:
            first = kvdeck()
            pairs.append((first, baseline()))
        else:
            second = baseline()
            pairs.append((kvdeck(), second))
    return pairs


def ratio_summary(ratios: list[float]) -> dict:
    """The median pair ratio and the spread of the pairs."""
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "pairs": ratios}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy outputs share."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))
