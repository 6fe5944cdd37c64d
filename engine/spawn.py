"""Starting child processes safely from inside a full-screen terminal app."""

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def real_std_streams() -> Iterator[None]:
    """Put the real stdout/stderr back while a process is started.

    multiprocessing hands sys.stderr's fd to its helper process; under Textual that stream
    is a capture object whose fileno() is -1, and the spawn fails ("bad value(s) in
    fds_to_keep").
    """
    saved = sys.stdout, sys.stderr
    try:
        if sys.__stdout__ is not None and sys.__stderr__ is not None:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        yield
    finally:
        sys.stdout, sys.stderr = saved


def redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (fds 1 and 2) to a log file, so a child of a
    TUI never writes into the terminal the TUI draws on."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
