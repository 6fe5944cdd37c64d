"""What the help screen and the command palette list: the app's keys that act now, the
section's keys, the keys a screen lists for its focused widgets, and a command for each."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from kvdeck.tui.navigation import SECTIONS

if TYPE_CHECKING:
    from kvdeck.tui.app import KvdeckApp

PALETTE_BINDING = Binding("ctrl+p", "command_palette", "Commands", id="command_palette",
                          tooltip="Command palette: every action of the app")


def help_groups(app: KvdeckApp) -> list[tuple[str, list[Binding]]]:
    usable = [b for b in _bindings(app.BINDINGS) if app.check_action(b.action, ())]
    groups: list[tuple[str, list[Binding]]] = [("Everywhere", [PALETTE_BINDING, *usable])]
    base = app.screen_stack[0] if app.screen_stack else None
    if base is not None and _bindings(base.BINDINGS):
        section = next((s.title for s in SECTIONS if s.id == app.current_mode), "Screen")
        groups.append((section, _bindings(base.BINDINGS)))
    # Keys that only act where their widget has focus (a screen lists them).
    for title, bindings in getattr(base, "HELP_GROUPS", ()):
        groups.append((title, _bindings(bindings)))
    return groups


def section_and_key_commands(app: KvdeckApp, screen: Screen) -> Iterable[SystemCommand]:
    """The palette's commands beyond Textual's own."""
    for section in SECTIONS:
        yield SystemCommand(f"Go to {section.title}", section.description,
                            lambda s=section.id: app.action_switch_section(s))
    yield SystemCommand("Stop load burst", "Abort all load-generator requests",
                        app.action_stop_load)
    for binding in _bindings(app.BINDINGS):
        if binding.action in ("quit", "command_palette") or binding.id.startswith("section_"):
            continue
        if not app.check_action(binding.action, ()):
            continue
        yield SystemCommand(binding.description, _command_help(binding),
                            lambda a=binding.action: app.run_action(a))
    base = app.screen_stack[0] if app.screen_stack else screen
    for binding in _bindings(base.BINDINGS):
        yield SystemCommand(binding.description, _command_help(binding),
                            lambda a=binding.action, s=base: app.run_action(a, s))


def _command_help(binding: Binding) -> str:
    return f"{binding.tooltip or binding.description} ({binding.key})"


def _bindings(bindings: Iterable[object]) -> list[Binding]:
    return [b for b in bindings if isinstance(b, Binding) and b.id]
