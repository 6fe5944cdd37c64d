"""Replay's position: play state and speed, the time into the recording, the engine step,
and a slider of the whole recording with the position on it."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from kvdeck.tui.replay_cursor import ReplayCursor

REFRESH_S = 0.1


def clock(seconds: float) -> str:
    minutes, rest = divmod(max(seconds, 0.0), 60)
    return f"{int(minutes):02d}:{rest:04.1f}"


def position_text(cursor: ReplayCursor, width: int) -> Text:
    stats = cursor.stats
    text = Text()
    text.append("▶ " if cursor.playing else "⏸ ", style="bold")
    text.append(f"{cursor.speed}x  ", style="bold")
    text.append(f"{clock(cursor.t - cursor.start)} / {clock(cursor.end - cursor.start)}",
                style="bold")
    text.append(f"  step {stats.num_steps}  snapshot {cursor.index + 1}/{len(cursor.times)}  "
                f"{time.strftime('%H:%M:%S', time.localtime(cursor.t))}  ")
    slider = max(width - len(text.plain) - 2, 10)
    span = cursor.end - cursor.start
    at = round((cursor.t - cursor.start) / span * (slider - 1)) if span > 0 else 0
    text.append("━" * at, style="#4363d8")
    text.append("●", style="bold #e6194b")
    text.append("─" * (slider - at - 1), style="#7a7a7a")
    return text


class ReplayBar(Static):
    DEFAULT_CSS = "ReplayBar { height: 1; padding: 0 1; }"

    def __init__(self, cursor: ReplayCursor, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cursor = cursor
        self._drawn: tuple[int, int] | None = None

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self.redraw)
        self.redraw()

    def redraw(self) -> None:
        key = (self.cursor.version, self.size.width)
        if key != self._drawn:
            self._drawn = key
            self.update(position_text(self.cursor, self.size.width - 2))
