"""Helpers for folders written under a temporary name and renamed when complete.
Light (no torch), so the UI process can clean up after jobs without loading the quantiser."""

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a staging folder's owner may be gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
