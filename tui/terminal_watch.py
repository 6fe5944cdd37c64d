"""Noticing that the terminal went away, so the app can quit and stop its engine.

Closing a terminal sends SIGHUP, but a parent such as `make` can die of it without passing
it on; the app then spun on a dead terminal with its engine alive. So both: the signal, and
a check each second that stdin is still a terminal (after a hang-up it no longer is).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable

from textual.app import App

CHECK_S = 1.0  # how often the terminal is checked


def watch_terminal(app: App, on_gone: Callable[[], None]) -> None:
    """Call on_gone when the app's terminal goes away (nothing for a headless app)."""
    if app.is_headless:
        return
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, AttributeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_gone)
    fd = terminal_fd()
    if fd is not None:
        app.set_interval(CHECK_S, lambda: None if os.isatty(fd) else on_gone())


def terminal_fd() -> int | None:
    """The terminal this process draws on (stdin's), or None (a pipe, a test)."""
    stream = sys.__stdin__
    with contextlib.suppress(AttributeError, OSError, ValueError):
        if stream is not None and os.isatty(stream.fileno()):
            return stream.fileno()
    return None
