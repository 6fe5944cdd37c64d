"""The TUI's typed messages: what a screen or widget asks the app (or a screen) to act on.

Widgets get the services they read (engine session, dashboard state, stores) through
their constructors; anything that changes the app's own state (restart the engine, switch
the model) travels up as one of these messages instead of a call into the App.
"""

from __future__ import annotations

from textual.message import Message


class RestartEngineRequested(Message):
    """The engine error screen's "restart": start a fresh engine process."""


class EngineHealthCheck(Message):
    """A request failed: the app checks whether the engine itself is still alive."""


class SwitchModelRequested(Message):
    """Load another model into the engine (stop this one, start one on `model`)."""

    def __init__(self, model: str | None, name: str) -> None:
        super().__init__()
        self.model = model  # a directory or hub id; None: the bundled demo model
        self.name = name  # as the Models screen lists it


class LoadBurstStarted(Message):
    """The app fired a load-generator burst; the deck shows the dashboard to watch it."""

    def __init__(self, num_requests: int, seed: int) -> None:
        super().__init__()
        self.num_requests = num_requests
        self.seed = seed


class ChatFocusRequested(Message):
    """Escape in a table of the deck (the request table): the focus goes back to the chat
    input, and the chat comes into view if it was hidden."""
