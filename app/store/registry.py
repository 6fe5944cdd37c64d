"""kvdeck's registry: which models are verified, which downloads are in progress, and
which folders elsewhere on disk the user added to kvdeck's list.

A JSON file under the data directory. Every change is read-modify-write under an exclusive
file lock (download threads, quantise jobs and a CLI may run at once) and written to a
temporary name then renamed, so a crash never leaves it half-written.
"""

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kvdeck.app.store import paths

_EMPTY = {"version": 1, "verified": {}, "pending": {}, "folders": {}}


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return json.loads(json.dumps(_EMPTY))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: the model registry is unreadable ({exc}); delete it to reset") from exc
    for key in ("verified", "pending", "folders"):
        data.setdefault(key, {})
    return data


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".registry-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    path = paths.registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read() -> dict:
    with _locked() as path:
        return _load(path)


def update(change: Callable[[dict], None]) -> None:
    with _locked() as path:
        data = _load(path)
        change(data)
        _write_atomic(path, data)


def hf_key(repo_id: str, commit: str) -> str:
    return f"hf:{repo_id}@{commit}"


def store_key(name: str) -> str:
    return f"store:{name}"


def mark_pending(repo_id: str, revision: str, commit: str) -> None:
    def change(data: dict) -> None:
        data["pending"][repo_id] = {"revision": revision, "commit": commit, "started": time.time()}

    update(change)


def mark_verified(key: str, record: dict) -> None:
    """Register a verified model; for a hub model this also ends its pending download."""

    def change(data: dict) -> None:
        data["verified"][key] = {**record, "verified_at": time.time()}
        repo_id = record.get("repo_id")
        if repo_id and data["pending"].get(repo_id, {}).get("commit") == record.get("commit"):
            del data["pending"][repo_id]

    update(change)


def forget(prefix: str) -> None:
    """Drop every verified entry whose key starts with `prefix` (and a pending repo of that id)."""

    def change(data: dict) -> None:
        for key in [k for k in data["verified"] if k.startswith(prefix)]:
            del data["verified"][key]
        if prefix.startswith("hf:"):
            data["pending"].pop(prefix[3:].rstrip("@"), None)

    update(change)


def add_folder(name: str, path: str) -> None:
    """List a model folder that lives outside kvdeck's store under `name`."""

    def change(data: dict) -> None:
        data["folders"][name] = {"path": path, "added": time.time()}

    update(change)


def remove_folder(name: str) -> None:
    """Take an added folder off the list (its files are not touched)."""

    def change(data: dict) -> None:
        data["folders"].pop(name, None)

    update(change)
