"""Recording the session from the TUI: `kvdeck --record FILE` (or `attach --record`) starts
at launch; ctrl+r starts and stops one at any time (into the data folder's recordings/).

The dashboard's state is the tap: every snapshot and latency the dashboard gets goes to
the recorder too (so a local engine and an attached server record alike); a local engine
also gives its final outputs (whole timelines) and its steps (engine_ready).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvdeck.app.record.session import SessionRecorder
    from kvdeck.tui.dashboard_state import DashboardState

REC_MARK = "● REC"


def default_recording_path() -> Path:
    from kvdeck.app.store.paths import data_dir

    folder = data_dir() / "recordings"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"kvdeck-{stamp}.kvrec"
    n = 1
    while path.exists():  # two in one second
        n += 1
        path = folder / f"kvdeck-{stamp}-{n}.kvrec"
    return path


@dataclass(slots=True)
class RecordingControl:
    state: DashboardState
    max_mb: float = 20.0
    recorder: SessionRecorder | None = None
    _client: Any = None  # the engine client being recorded (for its outputs and steps)
    _model_name: str = ""

    @property
    def active(self) -> bool:
        return self.recorder is not None

    @property
    def path(self) -> Path | None:
        return self.recorder.path if self.recorder is not None else None

    def start(self, path: Path | None = None) -> Path:
        """Start recording (RecordingError if the file cannot be written)."""
        from kvdeck.app.record.session import SessionRecorder

        self.stop()
        recorder = SessionRecorder(path or default_recording_path(), self.max_mb)
        self.recorder = recorder
        self.state.recorder = recorder
        if self.state.stats is not None:  # the moment it starts, not the next snapshot's
            recorder.on_stats(self.state.stats)
        if self._client is not None:
            self._watch(self._client)
        return recorder.path

    def stop(self) -> Path | None:
        """Stop and close the file (it is complete and one file once this returns)."""
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return None
        if self.state.recorder is recorder:
            self.state.recorder = None
        recorder.close()
        return recorder.path

    def engine_ready(self, client: Any, model_name: str) -> None:
        """A (re)started engine client: its description, outputs and steps are recorded."""
        self._client, self._model_name = client, model_name
        if self.recorder is not None:
            self._watch(client)

    def _watch(self, client: Any) -> None:
        assert self.recorder is not None
        self.recorder.describe(client, self._model_name)
        self.recorder.watch_engine(client, latencies=False)  # the dashboard reports latencies

    def title(self, name: str) -> str:
        """The header's subtitle: the model, and the recording while one runs."""
        path = self.path
        return f"{name} · {REC_MARK} {path.name}" if path is not None else name
