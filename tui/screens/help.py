"""F1: every key binding of the app (as currently mapped) and how to read the block map."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from kvdeck.tui.widgets.block_map import legend_text

MAP_HELP = (
    "One cell per physical KV block, row by row. Colour = the request that owns it. "
    "Select a request in the inspector (Tab to its table, ↑↓ or j/k, Enter) or click a "
    "block to highlight its blocks; "
    "hover a block for its id, state and reference count."
)


def bindings_tables(groups: list[tuple[str, list[Binding]]], key_display) -> Group:
    tables = []
    for title, bindings in groups:
        table = Table(title=title, title_justify="left", title_style="bold underline",
                      box=None, show_header=False, padding=(0, 1))
        table.add_column("key", style="bold", no_wrap=True, min_width=6)
        table.add_column("action")
        for binding in bindings:
            table.add_row(key_display(binding),
                          binding.tooltip or binding.description or binding.action)
        tables.append(table)
    return Group(*tables)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,f1,q", "dismiss", "Close help", id="close_help"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    HelpScreen Static { height: auto; margin-bottom: 1; }
    HelpScreen .help-title { text-style: bold; }
    """

    def __init__(self, groups: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.groups = groups

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("kvdeck · keys (esc closes)", classes="help-title")
            yield Static(bindings_tables(self.groups, self.app.get_key_display))
            yield Static("Block map", classes="help-title")
            yield Static(legend_text())
            yield Static(MAP_HELP)
