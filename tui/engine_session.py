"""The engine as the UI sees it: the current client, whether it is ready, which model.

The app owns the engine's lifecycle and keeps this up to date (a restart or a model switch
replaces the client); screens and widgets are handed this object and read it, so they
never reach into the App. The Models screen also asks it whether a model's files are in
use and waits for the engine to let go of them before deleting.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.engine.types.wire import EngineInfo
from kvdeck.tui.engine_protocol import EngineClientProtocol

DEMO_MODEL_NAME = "kvdeck-demo"  # the engine client's name for the bundled model


def display_model_name(model: str | None) -> str:
    """A local model directory shows as its folder name; a hub id stays as it is."""
    if model is None:
        return DEMO_MODEL_NAME
    path = Path(model).expanduser()
    return path.name if path.is_absolute() and path.is_dir() else model


@dataclass(slots=True)
class EngineSession:
    model: str | None = None  # what the engine was asked to run (None: the bundled demo)
    name: str = DEMO_MODEL_NAME  # how the title and transcripts name it
    client: EngineClientProtocol | None = None
    ready: bool = False
    _live_dirs: dict[int, Path] = field(default_factory=dict)  # client id -> its model dir

    @property
    def info(self) -> EngineInfo | None:
        """What the running engine is (its device, dtype, ...); None until it is ready, or
        for a client that does not say (an attached server's info is its JSON)."""
        info = getattr(self.client, "info", None) if self.ready else None
        return info if isinstance(info, EngineInfo) else None

    @property
    def usable(self) -> EngineClientProtocol | None:
        """The client, if it is ready for requests."""
        return self.client if self.ready else None

    def mark_running(self, client: EngineClientProtocol) -> None:
        """The client's engine process is up: its model directory is in use."""
        model_dir = getattr(client, "model_dir", None)
        if model_dir is not None:
            self._live_dirs[id(client)] = Path(model_dir).resolve()

    def mark_stopped(self, client: EngineClientProtocol) -> None:
        self._live_dirs.pop(id(client), None)

    def serving_dirs(self) -> frozenset[Path]:
        """The model directories running engine processes have loaded."""
        return frozenset(self._live_dirs.values())

    def serves(self, model_dir: Path) -> bool:
        """Whether a running engine process has this model directory loaded."""
        return Path(model_dir).resolve() in self._live_dirs.values()

    async def wait_released(self, model_dir: Path, timeout: float = 30.0) -> bool:
        """Wait until no engine process has `model_dir` loaded (False on timeout)."""
        deadline = time.monotonic() + timeout
        while self.serves(model_dir):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True
