"""`kvdeck replay FILE`: the dashboard of a recorded session, read-only, with a time slider
(kvdeck.tui.launch's run_replay). A file that is not a recording is refused before the
window opens."""

from __future__ import annotations

import argparse
import sys


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="a recording made with --record (kvdeck, kvdeck --serve, attach)")


def run_replay(args: argparse.Namespace) -> int:
    from kvdeck.app.record.format import RecordingError
    from kvdeck.app.record.reader import open_recording

    try:
        recording = open_recording(args.file)
    except RecordingError as exc:
        print(f"kvdeck replay: error: {exc}", file=sys.stderr)
        return 2
    from kvdeck.tui.launch import run_replay as run_replay_tui

    return run_replay_tui(recording)


COMMANDS = {  # name: (add_arguments, run); the help text is in kvdeck.app.cli
    "replay": (add_replay_arguments, run_replay),
}
