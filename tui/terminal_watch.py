"""Noticing that the terminal went away, so the app can quit and stop its engine.

Closing a terminal sends SIGHUP, but a parent such as `make` can die of it without passing
it on; the app then spun on a dead terminal with its engine alive. So both: the signal, and
a check each second that stdin is still a terminal (after a hang-up it no longer is).

And quitting must not wait on the dead terminal: Textual's output thread dies of the first
write to a hung-up terminal (EIO), and its queue then fills and blocks the app's next write
for good, so an app that had been open a while stayed behind (its engine gone, the process
not) after its terminal closed. The driver below drops the output once that thread is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable

from textual.app import App
from textual.driver import Driver

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


def hangup_safe(driver_class: type[Driver]) -> type[Driver]:
    """The driver Textual chose for this platform, Linux's made to drop its output once its
    output thread has died (the terminal hung up); any other as it is."""
    try:
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # no termios (Windows)
        return driver_class
    if driver_class is not LinuxDriver:
        return driver_class

    class HangupSafeDriver(LinuxDriver):
        def _output_gone(self) -> bool:
            writer = self._writer_thread  # Textual's own attribute: its output thread
            return writer is not None and not writer.is_alive()

        def write(self, data: str) -> None:
            if not self._output_gone():  # else nobody reads the queue: a write would block
                super().write(data)

        def close(self) -> None:
            if not self._output_gone():  # stopping the thread queues a write too
                super().close()

    return HangupSafeDriver
