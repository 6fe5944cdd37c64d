"""The command line: `kvdeck replay` refuses what is not a recording, and --record refuses
a file it would overwrite or a bad cap before any engine starts."""

from __future__ import annotations

from kvdeck.app.cli import main


def test_replay_refuses_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a recording")
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "kvdeck replay: error:" in err and "not a kvdeck recording" in err
    assert main(["replay", str(tmp_path / "missing.kvrec")]) == 2
    assert "no such recording file" in capsys.readouterr().err


def test_record_refuses_an_existing_file_and_a_bad_cap(tmp_path, capsys):
    existing = tmp_path / "old.kvrec"
    existing.write_text("keep")
    assert main(["--record", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["--serve", "--record", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["--record", str(tmp_path / "new.kvrec"), "--record-max-mb", "0"]) == 2
    assert "--record-max-mb must be > 0" in capsys.readouterr().err
    assert main(["attach", "http://127.0.0.1:9", "--record", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert existing.read_text() == "keep"
    assert not (tmp_path / "new.kvrec").exists()
