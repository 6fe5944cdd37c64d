"""How quantisation progress reads, in the CLI and the TUI alike (no torch here).

Durations read as durations ("3 min 20 s", "about 11 min left"), never as a clock time.
"""

from __future__ import annotations

MIN_FRACTION_FOR_ETA = 0.01  # before this much is done, a remaining time is a guess


def format_duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def remaining_seconds(fraction: float, elapsed_s: float) -> float | None:
    """Linear extrapolation of what is left, once enough is done to extrapolate from."""
    if fraction < MIN_FRACTION_FOR_ETA or fraction >= 1.0:
        return 0.0 if fraction >= 1.0 else None
    return elapsed_s / fraction * (1.0 - fraction)


def format_remaining(seconds: float | None) -> str:
    if seconds is None:
        return "estimating the time left"
    if seconds < 60:
        return "less than a minute left"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60:02d} min left"
