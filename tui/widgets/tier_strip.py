"""The block map's second strip: the KV tiers behind the device pool (host swap space, the
prefix cache's host and disk tiers), a bar and a line each (tui/tier_cells.py); hidden while
the engine has none configured."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from kvdeck.tui.tier_cells import bar_cells, tier_rows

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats

BAR_WIDTH = 24
NAME_WIDTH = 11
EMPTY_COLOUR = "#7a7a7a"


def tier_strip_text(stats: EngineStats, bar_width: int = BAR_WIDTH) -> Text:
    text = Text()
    for i, row in enumerate(tier_rows(stats)):
        if i:
            text.append("\n")
        filled = bar_cells(row, bar_width)
        text.append(f"{row.name:<{NAME_WIDTH}}", style=f"bold {row.colour}")
        text.append("█" * filled, style=row.colour)
        text.append("·" * (bar_width - filled), style=EMPTY_COLOUR)
        text.append(f" {row.used:,} / {row.total:,} blocks · {row.detail}")
    return text


class TierStrip(Static):
    DEFAULT_CSS = "TierStrip { display: none; height: auto; padding: 0 0 0 0; }"

    def show(self, stats: EngineStats) -> None:
        text = tier_strip_text(stats)
        self.display = bool(text.plain)
        if self.display:
            self.update(text)
