"""`--record FILE` and `--record-max-mb`: the TUI (`kvdeck`), the server (`kvdeck --serve`) and
`kvdeck attach` write their session into a recording that `kvdeck replay FILE` opens
(kvdeck.app.record)."""

import argparse
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.record.session import check_record_path
from kvdeck.app.record.writer import DEFAULT_MAX_MB


@dataclass(frozen=True, slots=True)
class RecordOptions:
    path: Path
    max_mb: float = DEFAULT_MAX_MB


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("recording")
    group.add_argument("--record", default=None, metavar="FILE",
                       help="record the session (snapshots, latencies, request timelines) "
                            "into FILE, a new file; `kvdeck replay FILE` plays it back")
    group.add_argument("--record-max-mb", type=float, default=DEFAULT_MAX_MB, metavar="MB",
                       help=f"cap the recording at MB (default {DEFAULT_MAX_MB:g}, about 10 "
                            "busy minutes); past it the oldest seconds are dropped")


def record_options(args: argparse.Namespace) -> RecordOptions | None:
    """The recording asked for (None: none); ValueError naming a bad path or cap."""
    path = getattr(args, "record", None)
    if path is None:
        return None
    if not args.record_max_mb > 0:
        raise ValueError(f"--record-max-mb must be > 0, got {args.record_max_mb:g}")
    return RecordOptions(check_record_path(path), args.record_max_mb)
