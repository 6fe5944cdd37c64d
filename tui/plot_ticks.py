"""Tidy axis ticks for the dashboard's graphs: 0, 25, 50 or 0.2, 0.4, never 3352.7."""

from __future__ import annotations

import math
from decimal import Decimal

NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def nice_ticks(high: float, count: int = 4) -> list[float]:
    """0 and about `count` evenly spaced round values up to at least `high` (> 0)."""
    if not high > 0 or not math.isfinite(high):
        high = 1.0
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(s * magnitude for s in NICE_STEPS if s * magnitude >= raw)
    top = math.ceil(high / step - 1e-9) * step
    return [round(i * step, 10) for i in range(int(round(top / step)) + 1)]


def tick_label(value: float, step: float) -> str:
    """As many decimals as the step needs, and no more."""
    exponent = Decimal(repr(round(step, 10))).normalize().as_tuple().exponent
    decimals = max(0, -exponent) if isinstance(exponent, int) else 0
    return f"{value:.{decimals}f}"


def labelled(ticks: list[float]) -> list[str]:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    return [tick_label(t, step) for t in ticks]
