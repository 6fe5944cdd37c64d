"""Keys typed while nothing that takes text has focus belong to the screen's main input.

A click on the block map, a resize that hides the focused pane, or a table left focused
used to swallow what the user typed (or ran single-letter shortcuts with it). A screen
calls `stray_text(self, event)` from its on_key: a printable key that no focused widget
took as text and no binding claims is returned, for the screen to type into its input.
A paste is the same: `stray_paste` from the screen's on_paste.
"""

from __future__ import annotations

from textual import events
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input, TextArea


def stray_text(screen: Screen, event: events.Key) -> str | None:
    """The text of a key press that should go to the screen's main input, else None."""
    if not event.is_printable or not event.character:
        return None
    if isinstance(screen.focused, Input | TextArea):
        return None  # it is typing already (an Input stops the keys it takes)
    if event.key in screen.active_bindings:
        return None  # a shortcut of the focused widget, the screen or the app
    return event.character


def stray_paste(screen: Screen, event: events.Paste) -> str | None:
    """The pasted text when the focused widget does not take text (it bubbled up to the
    screen unused), else None."""
    if isinstance(screen.focused, Input | TextArea) or not event.text:
        return None  # pasted there already (the event bubbles on after it)
    return event.text


def is_shown(widget: Widget) -> bool:
    """Whether the widget and every container above it are displayed."""
    return all(node.display for node in widget.ancestors_with_self if isinstance(node, Widget))
