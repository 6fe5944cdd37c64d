"""A small time-series plot (plotext via textual-plotext; plotext pinned < 6)."""

from __future__ import annotations

from collections.abc import Iterable

from textual_plotext import PlotextPlot


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

    def set_points(self, points: Iterable[tuple[float, float]]) -> None:
        self._points = list(points)
        self._draw()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel("seconds")
        plt.ylabel(self.y_label)
        if self._points:
            xs = [round(x, 3) for x, _ in self._points]
            ys = [round(y, 3) for _, y in self._points]
            if self.lines:
                plt.plot(xs, ys, marker="braille")
            else:
                plt.scatter(xs, ys, marker="braille")
            high = self.y_max if self.y_max is not None else max(ys) * 1.1
            plt.ylim(0, high if high > 0 else 1.0)
        self.refresh()
