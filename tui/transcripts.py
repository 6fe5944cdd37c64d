"""Chat transcripts on disk: one JSON file per chat, written atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

FORMAT_VERSION = 1


def default_transcript_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("kvdeck")) / "transcripts"


@dataclass(slots=True)
class ChatTurn:
    role: str  # "user" | "assistant"
    content: str
    stats: str = ""  # the reply's TTFT / tokens/s / token count line, for assistant turns
    thinking: str = ""  # a thinking model's reasoning before the reply (never sent back)

    def __post_init__(self) -> None:
        if self.role not in ("user", "assistant"):
            raise ValueError(f"role must be 'user' or 'assistant', got {self.role!r}")


@dataclass(slots=True)
class Transcript:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    model: str = ""
    system_prompt: str = ""
    turns: list[ChatTurn] = field(default_factory=list)

    @property
    def title(self) -> str:
        for turn in self.turns:
            if turn.role == "user" and turn.content.strip():
                first_line = turn.content.strip().splitlines()[0]
                return first_line[:60]
        return "(empty chat)"

    def messages(self) -> list[dict[str, str]]:
        """The chat-template messages for the next request."""
        messages = []
        if self.system_prompt.strip():
            messages.append({"role": "system", "content": self.system_prompt})
        messages.extend({"role": t.role, "content": t.content} for t in self.turns)
        return messages

    def to_json(self) -> dict:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> Transcript:
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            raise ValueError(f"not a kvdeck transcript (format {FORMAT_VERSION}): {data!r:.80}")
        turns = [ChatTurn(**t) for t in data.get("turns", [])]
        return cls(id=str(data["id"]), created=str(data.get("created", "")),
                   model=str(data.get("model", "")),
                   system_prompt=str(data.get("system_prompt", "")), turns=turns)


@dataclass(slots=True)
class TranscriptStore:
    directory: Path

    def path_for(self, transcript_id: str) -> Path:
        if not transcript_id or not transcript_id.isalnum():
            raise ValueError(f"transcript id must be alphanumeric, got {transcript_id!r}")
        return self.directory / f"{transcript_id}.json"

    def save(self, transcript: Transcript) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(transcript.id)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{transcript.id}.", suffix=".tmp",
                                        dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(transcript.to_json(), handle, ensure_ascii=False, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return path

    def load(self, transcript_id: str) -> Transcript:
        path = self.path_for(transcript_id)
        with path.open(encoding="utf-8") as handle:
            return Transcript.from_json(json.load(handle))

    def list(self) -> list[Transcript]:
        """Saved transcripts, newest first; unreadable files are skipped."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.glob("*.json"):
            try:
                with path.open(encoding="utf-8") as handle:
                    found.append(Transcript.from_json(json.load(handle)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        found.sort(key=lambda t: (t.created, t.id), reverse=True)
        return found
