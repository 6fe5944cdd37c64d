"""Progress of a model download: per file and in total, with speed and ETA; and cancellation.

huggingface_hub's `http_get` reports bytes through a tqdm-like class; `tqdm_class_for`
builds one bound to a tracker, and that is also where cancellation is checked: raising
from `update()` aborts the transfer between two chunks and leaves the partial file for a
later resume.
"""

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_SPEED_WINDOW_S = 3.0
REPORT_INTERVAL_S = 0.1


class DownloadCancelled(Exception):
    """The user cancelled; what was fetched so far stays on disk for a resume."""


@dataclass(slots=True)
class FileProgress:
    name: str
    size: int
    done: int = 0
    state: str = "waiting"  # waiting | downloading | verifying | done


@dataclass(slots=True)
class DownloadProgress:
    repo_id: str
    phase: str  # resolving | downloading | verifying | done
    files: list[FileProgress]
    total_bytes: int
    done_bytes: int
    speed_bps: float  # bytes per second over the last few seconds
    eta_s: float | None  # None while the speed is unknown
    current_file: str | None

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 0.0


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise DownloadCancelled("download cancelled; run it again to resume")


@dataclass(slots=True)
class ProgressTracker:
    repo_id: str
    on_progress: Callable[[DownloadProgress], None] | None
    cancel: CancelToken
    files: list[FileProgress] = field(default_factory=list)
    phase: str = "resolving"
    current_file: str | None = None
    _samples: deque = field(default_factory=deque)  # (time, bytes moved this session)
    _moved: int = 0
    _last_report: float = 0.0

    def set_files(self, files: list[FileProgress]) -> None:
        self.files = files
        self.report(force=True)

    def start_file(self, entry: FileProgress, already: int) -> None:
        entry.done = already
        entry.state = "downloading"
        self.current_file = entry.name
        self.phase = "downloading"
        self.report(force=True)

    def add_bytes(self, entry: FileProgress, count: int) -> None:
        self.cancel.check()
        entry.done = max(0, entry.done + count)
        self._moved += count
        self.report()

    def finish_file(self, entry: FileProgress) -> None:
        entry.done = entry.size
        entry.state = "done"
        self.report(force=True)

    def set_phase(self, phase: str, entry: FileProgress | None = None) -> None:
        self.phase = phase
        if entry is not None:
            entry.state = phase
            self.current_file = entry.name
        self.report(force=True)

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        self._samples.append((now, self._moved))
        while len(self._samples) > 2 and now - self._samples[0][0] > _SPEED_WINDOW_S:
            self._samples.popleft()
        if self.on_progress is None or (not force and now - self._last_report < REPORT_INTERVAL_S):
            return
        self._last_report = now
        self.on_progress(self.snapshot())

    def snapshot(self) -> DownloadProgress:
        total = sum(f.size for f in self.files)
        done = sum(min(f.done, f.size) for f in self.files)
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        speed = (b1 - b0) / (t1 - t0) if t1 - t0 > 0.2 else 0.0
        eta = (total - done) / speed if speed > 0 else None
        return DownloadProgress(
            repo_id=self.repo_id,
            phase=self.phase,
            files=[FileProgress(f.name, f.size, f.done, f.state) for f in self.files],
            total_bytes=total,
            done_bytes=done,
            speed_bps=speed,
            eta_s=eta,
            current_file=self.current_file,
        )


def tqdm_class_for(tracker: ProgressTracker, entry: FileProgress) -> type:
    """A tqdm stand-in for huggingface_hub's `http_get` that feeds `tracker`."""

    class _Bar:
        def __init__(self, **_kwargs: object) -> None:
            pass

        def __enter__(self) -> "_Bar":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, count: int) -> None:
            # Negative when the server ignored a Range request and the file restarts at 0.
            tracker.add_bytes(entry, count)

        def close(self) -> None:
            pass

    return _Bar


def format_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(count) < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"
