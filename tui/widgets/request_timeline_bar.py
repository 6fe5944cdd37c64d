"""Why the selected request is slow, in four lines: the engine's reason line, a bar of its life
(queued / prefill / decode / preempted, each segment as long as its share of the time), the
time in each phase, and its time to first token in parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from kvdeck.engine.types.request_timeline import DECODE, PREEMPTED, PREFILL, QUEUED, SWAPPED

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from kvdeck.engine.types.request_timeline import TimelineSnapshot, TTFTParts
    from kvdeck.engine.types.stats import RequestStats

PHASE_COLOURS = {QUEUED: "#a9a9a9", PREFILL: "#f58231", DECODE: "#3cb44b", PREEMPTED: "#e6194b",
                 SWAPPED: "#f032e6"}
BAR = "█"
DEFAULT_WIDTH = 40


def seconds_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def bar_cells(durations: list[tuple[str, float]], width: int) -> list[tuple[str, int]]:
    """(phase, cells) per segment: proportional to time, every segment at least one cell,
    `width` cells in all when the segments allow it."""
    total = sum(seconds for _, seconds in durations)
    if total <= 0 or not durations:
        return [(phase, 1) for phase, _ in durations]
    spare = max(0, width - len(durations))  # one cell each, the rest shared by time
    shares = [seconds / total * spare for _, seconds in durations]
    cells = [1 + int(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    for i in by_remainder[: max(0, width - sum(cells))]:
        cells[i] += 1
    return [(phase, n) for (phase, _), n in zip(durations, cells, strict=True)]


def timeline_bar(timeline: TimelineSnapshot, width: int) -> Text:
    text = Text()
    for phase, cells in bar_cells(timeline.durations(), width):
        text.append(BAR * cells, style=PHASE_COLOURS.get(phase, ""))
    return text


def phase_totals(timeline: TimelineSnapshot) -> Text:
    """Seconds spent in each phase (summed over its segments), in the order first reached."""
    totals: dict[str, float] = {}
    for phase, seconds in timeline.durations():
        totals[phase] = totals.get(phase, 0.0) + seconds
    text = Text()
    for i, (phase, seconds) in enumerate(totals.items()):
        if i:
            text.append(" · ")
        text.append(phase, style=f"bold {PHASE_COLOURS.get(phase, '')}".strip())
        text.append(f" {seconds_text(seconds)}")
    if timeline.preemptions:
        text.append(f" · {len(timeline.preemptions)}× preempted")
        if timeline.swaps:  # of those, the swaps: their K/V went to host memory and back
            nbytes, seconds = sum(s[1] for s in timeline.swaps), sum(s[2] for s in timeline.swaps)
            text.append(f" ({len(timeline.swaps)} swapped: {nbytes / (1 << 20):.1f} MiB, "
                        f"{seconds_text(seconds)})")
    return text


def ttft_text(ttft: TTFTParts) -> Text:
    text = Text()
    text.append("TTFT ", style="bold")
    text.append(f"{seconds_text(ttft.total_s)} = queue {seconds_text(ttft.queue_s)} + prefill "
                f"{seconds_text(ttft.prefill_s)} + first step {seconds_text(ttft.first_step_s)}")
    return text


def timeline_text(request: RequestStats, width: int, finished: bool = False) -> Text:
    timeline = request.timeline
    reason = request.reason
    if finished:
        ended = timeline.finish_reason if timeline is not None else None
        reason = f"finished{': ' + ended if ended else ''}"
    text = Text()
    text.append(reason or request.state, style="bold")
    if timeline is None:
        return text
    text.append("\n")
    text.append(timeline_bar(timeline, width))
    text.append("\n")
    text.append(phase_totals(timeline))
    if timeline.ttft is not None:
        text.append("\n")
        text.append(ttft_text(timeline.ttft))
    return text


@dataclass(slots=True)
class TimelineRenderable:
    """timeline_text at the width it is drawn at (the pane may change width between snapshots)."""

    request: RequestStats
    finished: bool = False

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield timeline_text(self.request, options.max_width or DEFAULT_WIDTH, self.finished)


class RequestTimelineBar(Static):
    """The selected request's reason line, bar and TTFT parts (hidden with none selected)."""

    DEFAULT_CSS = "RequestTimelineBar { display: none; height: auto; }"

    def show(self, request: RequestStats | None, finished: bool = False) -> None:
        """Hidden, too, for a request the engine told nothing about (an older server's)."""
        self.display = request is not None and (request.timeline is not None or bool(request.reason))
        if self.display:
            self.update(TimelineRenderable(request, finished))
