"""Make the real engine client for the TUI (imported lazily: the UI starts without torch)."""

from __future__ import annotations

import sys
from multiprocessing import resource_tracker

from tui.engine_protocol import ClientFactory, EngineClientProtocol


def ensure_spawn_helpers() -> None:
    """Start multiprocessing's resource tracker with the real stderr.

    While a Textual app runs, sys.stderr is a capture object whose fileno() is -1; the
    tracker, started lazily by the first spawned process, passes that fd to its child and
    the spawn fails ("bad value(s) in fds_to_keep"). Starting it up front avoids that.
    """
    captured = sys.stderr
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    try:
        resource_tracker.ensure_running()
    finally:
        sys.stderr = captured


def real_client_factory(model: str | None, engine_kwargs: dict) -> ClientFactory:
    def make_client() -> EngineClientProtocol:
        from engine.client import EngineClient

        ensure_spawn_helpers()
        return EngineClient(model, **engine_kwargs)

    return make_client
