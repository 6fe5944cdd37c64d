"""The chat settings on disk (the user config dir), so they survive a restart.

One JSON file, written to a temporary name and renamed, so a crash never leaves half a
file. An unreadable or invalid file is not fatal: the defaults are used and `problem`
says why, for the UI to show.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from kvdeck.tui.chat_settings import ChatSettings

FORMAT_VERSION = 1
FILE_NAME = "chat_settings.json"


def default_settings_path() -> Path:
    from kvdeck.app.store.paths import config_dir

    return config_dir() / FILE_NAME


class SettingsStore:
    """`current` is what the chat uses; `save()` makes it the new current and writes it.
    With `path=None` nothing is written (tests, or a read-only setup)."""

    def __init__(self, path: Path | None, initial: ChatSettings | None = None) -> None:
        self.path = path
        self.problem: str | None = None
        self.current = initial if initial is not None else self._load()

    def _load(self) -> ChatSettings:
        if self.path is None or not self.path.exists():
            return ChatSettings()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
                raise ValueError(f"not a kvdeck settings file (format {FORMAT_VERSION})")
            return ChatSettings.from_json(data.get("chat", {}))
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path}: {exc}; using the defaults"
            return ChatSettings()

    def save(self, settings: ChatSettings) -> None:
        """Use `settings` from now on and write them (OSError if the disk refuses)."""
        self.current = settings
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"format": FORMAT_VERSION, "chat": settings.to_json()}, handle,
                          ensure_ascii=False, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
