"""A small time-series plot (plotext via textual-plotext; plotext pinned < 6).

Every plot of the dashboard shows the same window (the last WINDOW_S seconds, "now" at the
right edge), so a TTFT spike and the KV peak that caused it line up; ticks are round.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual_plotext import PlotextPlot

from kvdeck.tui.plot_ticks import labelled, nice_ticks

WINDOW_S = 60.0
X_TICKS = (-60.0, -45.0, -30.0, -15.0, 0.0)
X_LABELS = ("-60 s", "-45 s", "-30 s", "-15 s", "now")


class TimeSeriesPlot(PlotextPlot):
    DEFAULT_CSS = """
    TimeSeriesPlot { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, y_label: str, *, lines: bool = False,
                 y_max: float | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.y_label = y_label
        self.lines = lines  # a continuous series (lines) or one point per event (scatter)
        self.y_max = y_max
        self._points: list[tuple[float, float]] = []

    def on_mount(self) -> None:
        super().on_mount()
        self._draw()

    def on_resize(self) -> None:
        self._draw()  # the number of ticks follows the height

    def set_points(self, points: Iterable[tuple[float, float]], now: float) -> None:
        """(seconds since start, value) points; those of the last WINDOW_S before `now`."""
        self._points = [(x - now, y) for x, y in points if now - WINDOW_S <= x <= now]
        self._draw()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.ylabel(self.y_label)
        plt.xlim(-WINDOW_S, 0)
        plt.xticks(list(X_TICKS), list(X_LABELS))
        high = self.y_max
        if self._points:
            xs = [round(x, 3) for x, _ in self._points]
            ys = [round(y, 3) for _, y in self._points]
            if self.lines:
                plt.plot(xs, ys, marker="braille")
            else:
                plt.scatter(xs, ys, marker="braille")
            high = high if high is not None else max(ys) * 1.1
        # As many round ticks as the height shows (plotext drops what does not fit, which
        # left uneven ticks such as 40, 10, 0 on a small plot).
        rows = self.size.height - 4  # title, axis, tick labels, unit
        ticks = nice_ticks(high if high else 1.0, 4 if rows >= 10 else 2 if rows >= 4 else 1)
        plt.ylim(0, ticks[-1])
        plt.yticks(ticks, labelled(ticks))
        self.refresh()
