"""Starting worker processes (the engine core, background jobs) from any parent: a
full-screen terminal app, a server, a test.

Always spawned, never forked: a forked child cannot use CUDA, and forking a process with
Textual's or torch's threads is unsafe. The child is named by "module:function", so the
parent imports nothing of what the child runs (the UI process never loads torch for the
engine it starts). Its stdout and stderr go to a log file, never into a terminal a TUI
draws on.
"""

import contextlib
import importlib
import importlib.util
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

SPAWN = multiprocessing.get_context("spawn")


@contextlib.contextmanager
def real_std_streams() -> Iterator[None]:
    """Put the real stdout/stderr back while a process (or a semaphore's resource tracker)
    is started.

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
    """Send this process's stdout and stderr (fds 1 and 2) to a log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def start_process(target: str, args: tuple, *, log_path: str | None, name: str | None = None,
                  daemon: bool = True) -> BaseProcess:
    """Spawn a process that runs `target` ("module:function") with `args`.

    `daemon`: the child never outlives this process, even if nobody stops it.
    """
    resolve_target(target)  # a typo fails here, in the parent, not in a log
    process = SPAWN.Process(target=_child_main, args=(target, args, log_path), name=name,
                            daemon=daemon)
    with real_std_streams():
        process.start()
    return process


def resolve_target(target: str) -> None:
    """ValueError unless `target` names a module and function (without importing it)."""
    module_name, _, function = target.partition(":")
    if not function or importlib.util.find_spec(module_name) is None:
        raise ValueError(f"spawn target {target!r} is not 'module:function' of an importable module")


def _child_main(target: str, args: tuple, log_path: str | None) -> None:
    if log_path is not None:
        redirect_output(log_path)
    module_name, _, function = target.partition(":")
    getattr(importlib.import_module(module_name), function)(*args)
