"""A recording survives its process being killed, and stays under its size cap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvdeck.app.record.reader import open_recording
from kvdeck.app.record.writer import RecordingWriter
from tests.record.synthetic import DT, ENGINE_INFO, session_stats

REPO = Path(__file__).resolve().parents[2]

# Records a synthetic session in real time (its snapshots stamped with the clock), saying
# how far it got, until it is killed.
CHILD = """
import dataclasses, sys, time
from kvdeck.app.record.writer import RecordingWriter
from tests.record.synthetic import ENGINE_INFO, session_stats
writer = RecordingWriter(sys.argv[1], ENGINE_INFO, chunk_s=0.25, keyframe_s=0.5)
stats = session_stats(400)
for i, snapshot in enumerate(stats):
    writer.add_stats(dataclasses.replace(snapshot, timestamp=time.time()))
    print(i, time.time(), flush=True)
    time.sleep(0.02)
"""


def test_a_recording_cut_by_sigkill_opens(tmp_path):
    path = tmp_path / "killed.kvrec"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        lines = []
        assert child.stdout is not None
        while len(lines) < 60:  # about 1.5 s of recording, several chunks committed
            line = child.stdout.readline()
            assert line, "the recording process ended early"
            lines.append(line.split())
        time.sleep(0.6)  # more than a chunk: what was written 0.5 s before the kill is in
        killed_at = time.time()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert Path(f"{path}-wal").exists()  # a killed writer leaves its write-ahead log
    with open_recording(path) as rec:
        assert not rec.complete
        snapshots = list(rec.snapshots())
        stats = session_stats(400)
        assert len(snapshots) >= 60
        # Everything committed reads back whole: the requests and block map of each moment.
        for i, (_t, snapshot) in enumerate(snapshots):
            assert snapshot.requests == stats[i].requests
            assert snapshot.block_ref_counts == stats[i].block_ref_counts
        assert rec.end >= killed_at - 1.0  # up to its last second


def test_the_size_cap_holds(tmp_path):
    path = tmp_path / "capped.kvrec"
    stats = session_stats(600)
    cap_mb = 0.05
    writer = RecordingWriter(path, ENGINE_INFO, max_mb=cap_mb, chunk_s=0.35, keyframe_s=1.0)
    for snapshot in stats:
        writer.add_stats(snapshot)
    writer.close()
    assert writer.counters.trimmed_chunks > 0
    assert writer.counters.bytes <= cap_mb * 1024 * 1024
    # The file: the chunks under the cap plus SQLite's own pages (schema, index, free pages).
    assert path.stat().st_size <= cap_mb * 1024 * 1024 + 64 * 1024
    assert not Path(f"{path}-wal").exists()  # closed: one self-contained file
    with open_recording(path) as rec:
        kept = list(rec.snapshots())
        assert rec.start > stats[0].timestamp + 10 * DT  # the oldest were dropped
        assert rec.meta["trimmed_before"]
        first = next(i for i, s in enumerate(stats) if s.timestamp == rec.start)
        assert [s for _, s in kept] == stats[first:]  # what is left decodes, to the end
