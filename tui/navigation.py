"""The app's top-level sections: each is a Textual mode with its own screen stack.

Adding a section (e.g. the model manager's "Models" screen) is one entry here: the app
builds its modes, its switch bindings (with ids, so keymaps work), its command-palette
entries and its help from this list. A section's factory gets the app, so a screen can be
handed the services the app owns (screens post messages for what the app must do), e.g.

    def _models_screen(app: KvdeckApp) -> Screen:
        from kvdeck.tui.screens.models_screen import ModelsScreen
        return ModelsScreen(engine=app.engine, activity=app.activity)

    Section("models", "Models", "f5", "Download, quantise, load models", _models_screen)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.screen import Screen

if TYPE_CHECKING:
    from kvdeck.tui.app import KvdeckApp


@dataclass(frozen=True, slots=True)
class Section:
    id: str  # the mode name; the binding id is f"section_{id}"
    title: str
    key: str
    description: str
    screen: Callable[[KvdeckApp], Screen]  # called once, when the section is first shown


def _deck_screen(app: KvdeckApp) -> Screen:
    from kvdeck.tui.screens.deck import DeckScreen

    return DeckScreen(app.engine, app.dashboard_state, app.settings, app.transcripts, app.activity,
                      app.servers)


def _models_screen(app: KvdeckApp) -> Screen:
    from kvdeck.tui.screens.models_screen import ModelsScreen

    return ModelsScreen(engine=app.engine, activity=app.activity)


SECTIONS: list[Section] = [
    Section("deck", "Deck", "f4", "Chat beside the live engine dashboard", _deck_screen),
    Section("models", "Models", "f5", "Download, quantise, load and delete models", _models_screen),
]


def section_bindings(sections: list[Section]) -> list[Binding]:
    return [
        Binding(s.key, f"app.switch_section('{s.id}')", s.title, id=f"section_{s.id}",
                show=len(sections) > 1)
        for s in sections
    ]
