"""The block map's second strip: the KV tiers behind the device pool (host swap space, the
prefix cache's host and disk tiers), a bar and a line each (tui/tier_cells.py); hidden while
the engine has none configured. A line too long for the pane breaks between its figures,
the rest indented under the bar."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from kvdeck.tui.tier_cells import bar_cells, tier_rows
from kvdeck.tui.widgets.flow_text import FlowText

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats

BAR_WIDTH = 20  # with its figures, a tier fits the 96 columns of a 160-column deck
NAME_WIDTH = 11
EMPTY_COLOUR = "#7a7a7a"
SEP = " · "


def tier_strip_rows(stats: EngineStats, bar_width: int = BAR_WIDTH) -> list[list[Text]]:
    """A row per configured tier: its name, bar and blocks, then each figure of its detail."""
    rows = []
    for row in tier_rows(stats):
        filled = bar_cells(row, bar_width)
        head = Text()
        head.append(f"{row.name:<{NAME_WIDTH}}", style=f"bold {row.colour}")
        head.append("█" * filled, style=row.colour)
        head.append("·" * (bar_width - filled), style=EMPTY_COLOUR)
        head.append(f" {row.used:,} / {row.total:,} blocks")
        rows.append([head, *(Text(figure) for figure in row.detail.split(SEP))])
    return rows


def tier_strip_text(stats: EngineStats, bar_width: int = BAR_WIDTH) -> Text:
    """The strip unbroken, a line per tier."""
    return Text("\n").join(Text(SEP).join(parts) for parts in tier_strip_rows(stats, bar_width))


class TierStrip(FlowText):
    DEFAULT_CSS = "TierStrip { display: none; height: auto; padding: 0 0 0 0; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(sep=SEP, indent=NAME_WIDTH, id=id)

    def show(self, stats: EngineStats) -> None:
        rows = tier_strip_rows(stats)
        self.display = bool(rows)
        if rows:
            self.set_rows(rows)
