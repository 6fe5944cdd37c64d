"""A file that is not a readable recording is refused with an error naming the problem."""

from __future__ import annotations

import sqlite3

import pytest

from kvdeck.app.record.format import RecordingError
from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.writer import RecordingWriter
from tests.record.synthetic import ENGINE_INFO, session_stats


def test_missing_file(tmp_path):
    with pytest.raises(RecordingError, match="no such recording"):
        open_recording(tmp_path / "nope.kvrec")
    assert not (tmp_path / "nope.kvrec").exists()  # opening never creates it


def test_empty_file(tmp_path):
    path = tmp_path / "empty.kvrec"
    path.write_bytes(b"")
    with pytest.raises(RecordingError, match="is empty"):
        open_recording(path)


def test_not_sqlite(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a database\n" * 100)
    with pytest.raises(RecordingError, match="not a kvdeck recording"):
        open_recording(path)


def test_another_sqlite_file(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    db.close()
    with pytest.raises(RecordingError, match="not a kvdeck recording"):
        open_recording(path)


def test_newer_version(tmp_path):
    path = tmp_path / "s.kvrec"
    writer = RecordingWriter(path, ENGINE_INFO)
    writer.add_stats(session_stats(1)[0])
    writer.close()
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'version'")
    db.close()
    with pytest.raises(RecordingError, match="version 99 recording; this kvdeck reads versions 1, 2"):
        open_recording(path)


def test_recording_without_snapshots(tmp_path):
    path = tmp_path / "s.kvrec"
    RecordingWriter(path, ENGINE_INFO).close()
    with pytest.raises(RecordingError, match="no engine snapshots"):
        open_recording(path)


def test_writer_refuses_an_existing_file(tmp_path):
    path = tmp_path / "s.kvrec"
    path.write_text("keep me")
    with pytest.raises(RecordingError, match="already exists"):
        RecordingWriter(path, ENGINE_INFO)
    assert path.read_text() == "keep me"
    with pytest.raises(RecordingError, match="is not a folder"):
        RecordingWriter(tmp_path / "no-such-dir" / "s.kvrec", ENGINE_INFO)
