"""The block-table map: one cell per physical KV block, drawn with the line API.

Only the visible rows are rendered (ScrollView + render_line), so the map stays cheap with
tens of thousands of blocks; the per-block classification is done once per snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from kvdeck.tui.block_cells import (
    CACHED,
    FREE,
    KIND_NAMES,
    OWNED,
    ROLLED_BACK,
    SHARED,
    SPECULATIVE,
    WRITING,
    BlockCells,
    classify_blocks,
)
from kvdeck.tui.request_colours import RequestColours, palette_colour

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats

GLYPHS = {FREE: "·", CACHED: "○", OWNED: "█", SHARED: "▓", WRITING: "+", SPECULATIVE: "~",
          ROLLED_BACK: "×"}
# Two columns per block when the whole pool fits that way (small pools read better).
WIDE_GLYPHS = {FREE: "· ", CACHED: "○ ", OWNED: "██", SHARED: "▓▓", WRITING: "++", SPECULATIVE: "~~",
               ROLLED_BACK: "××"}
ROLLED_BACK_COLOUR = "#e6194b"
FREE_COLOUR = "#7a7a7a"
CACHED_COLOUR = "#5f87af"
UNOWNED_COLOUR = "#a0a0a0"  # referenced block that no listed request claims


def _mix(colour: str, other: str, weight: float) -> str:
    a = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i:i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(x * weight + y * (1 - weight)) for x, y in zip(a, b, strict=True)]
    return "#" + "".join(f"{v:02x}" for v in mixed)


def cell_style(kind: int, colour: str | None, muted: bool) -> Style:
    if kind == FREE:
        return Style(color=FREE_COLOUR)
    if kind == CACHED:
        return Style(color=CACHED_COLOUR)
    if kind == ROLLED_BACK:  # free again, flashed for the snapshot after the rollback
        return Style(color="#ffffff", bgcolor=ROLLED_BACK_COLOUR, bold=True)
    base = colour or UNOWNED_COLOUR
    if muted:  # another request is selected: push this one to the background
        base = _mix(base, "#808080", 0.3)
    if kind in (WRITING, SPECULATIVE):
        return Style(color="#ffffff", bgcolor=base, bold=True)
    return Style(color=base, bold=kind == SHARED)


def legend_parts(block_size: int | None = None, speculative: bool = False) -> list[Text]:
    """The legend's entries, a mark and its meaning each; `speculative`: speculative decoding
    is on, so its two marks are explained too."""
    entries = [
        ("█", Style(color=palette_colour(2)), "owned (colour: request)"),
        ("▓", Style(color=palette_colour(0), bold=True), "shared"),
        ("+", cell_style(WRITING, palette_colour(1), False), "written"),
        ("○", cell_style(CACHED, None, False), "cached"),
        ("·", cell_style(FREE, None, False), "free"),
    ]
    if speculative:
        entries[3:3] = [("~", cell_style(SPECULATIVE, palette_colour(1), False), "drafts"),
                        ("×", cell_style(ROLLED_BACK, None, False), "rolled back")]
    parts = [Text.assemble((glyph, style), f" {label}") for glyph, style, label in entries]
    if block_size is not None:
        parts.append(Text(f"· a cell is {block_size} tokens"))
    return parts


def legend_text(block_size: int | None = None, speculative: bool = False) -> Text:
    return Text("  ").join(legend_parts(block_size, speculative))


class BlockMap(ScrollView, can_focus=True):
    """A grid of physical blocks, row-major, as many columns as the widget is wide."""

    DEFAULT_CSS = """
    BlockMap { overflow-x: hidden; overflow-y: auto; }
    """

    selected_request: reactive[str | None] = reactive(None)

    class BlockClicked(Message):
        def __init__(self, block_id: int, owner: str | None) -> None:
            self.block_id = block_id
            self.owner = owner
            super().__init__()

    def __init__(self, colours: RequestColours | None = None, *, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.colours = colours or RequestColours()  # shared with the inspector
        self.cells: BlockCells | None = None
        self._styles: dict[tuple[int, int, bool], Style] = {}
        self._columns = 1  # blocks per row
        self._cell_width = 1  # terminal columns per block

    def update_stats(self, stats: EngineStats) -> None:
        self.colours.observe([r.request_id for r in stats.requests])
        self.cells = classify_blocks(stats)
        self._update_virtual_size()
        self.refresh()

    def watch_selected_request(self) -> None:
        self.refresh()

    def on_resize(self) -> None:
        self._update_virtual_size()

    def _update_virtual_size(self) -> None:
        region = self.scrollable_content_region
        count = self.cells.num_blocks if self.cells else 0
        fits_wide = count * 2 <= (region.width // 2) * 2 * region.height
        self._cell_width = 2 if count and fits_wide else 1
        self._columns = max(1, region.width // self._cell_width)
        rows = (count + self._columns - 1) // self._columns
        self.virtual_size = Size(region.width, rows)

    def _style_for(self, kind: int, owner: str | None) -> Style:
        colour_index = self.colours.index(owner) if owner is not None else -1
        selected = self.selected_request
        muted = selected is not None and owner != selected and kind >= OWNED
        key = (kind, colour_index, muted)
        style = self._styles.get(key)
        if style is None:
            colour = palette_colour(colour_index) if colour_index >= 0 else None
            if len(self._styles) > 4096:  # many bursts later: old requests' styles
                self._styles.clear()
            style = self._styles[key] = cell_style(kind, colour, muted)
        return style

    def render_line(self, y: int) -> Strip:
        cells = self.cells
        width = self.scrollable_content_region.width
        row = y + int(self.scroll_offset.y)
        base = self.rich_style
        if cells is None or width <= 0:
            return Strip.blank(max(width, 0), base)
        columns = self._columns
        start = row * columns
        end = min(start + columns, cells.num_blocks)
        glyphs = WIDE_GLYPHS if self._cell_width == 2 else GLYPHS
        segments: list[Segment] = []
        run_style: Style | None = None
        run_text: list[str] = []
        for block in range(start, end):
            kind = cells.kinds[block]
            style = self._style_for(kind, cells.owners[block])
            if style is not run_style and run_text:
                segments.append(Segment("".join(run_text), base + run_style))
                run_text = []
            run_style = style
            run_text.append(glyphs[kind])
        if run_text and run_style is not None:
            segments.append(Segment("".join(run_text), base + run_style))
        used = max(0, end - start) * self._cell_width
        if used < width:
            segments.append(Segment(" " * (width - used), base))
        return Strip(segments, width)

    def block_at(self, x: int, y: int) -> int | None:
        """The block under content offset (x, y) of the widget, if any."""
        column = x // self._cell_width
        if self.cells is None or x < 0 or column >= self._columns:
            return None
        block = (y + int(self.scroll_offset.y)) * self._columns + column
        return block if 0 <= block < self.cells.num_blocks else None

    def describe_block(self, block: int) -> str:
        cells = self.cells
        assert cells is not None
        owner = cells.owners[block] or "-"
        return (f"block {block}: {KIND_NAMES[cells.kinds[block]]}, ref {cells.ref_counts[block]}, "
                f"request {owner}")

    def on_mouse_move(self, event: events.MouseMove) -> None:
        offset = event.get_content_offset(self)
        block = self.block_at(offset.x, offset.y) if offset is not None else None
        self.tooltip = self.describe_block(block) if block is not None else None

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        block = self.block_at(offset.x, offset.y) if offset is not None else None
        if block is not None and self.cells is not None:
            self.post_message(self.BlockClicked(block, self.cells.owners[block]))
