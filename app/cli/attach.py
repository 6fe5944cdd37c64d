"""`kvdeck attach URL [URL...] [--api-key KEY]`: the TUI on servers instead of a local engine.

The chat talks to the first server through its OpenAI API (f6: the next one); the dashboard
draws a kvdeck server's own snapshots (block map, requests, latencies), or what a vLLM
server's /metrics say; with several URLs, a Servers tab shows each and their sum. No engine
is started and no model is loaded here, so it runs on a laptop watching a workstation.
The app itself is kvdeck.tui.app's, opened by kvdeck.tui.launch's `run_attached`.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvdeck.app.cli.record_flags import add_record_arguments, record_options

API_KEY_ENV = "KVDECK_API_KEY"


def add_attach_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL",
                        help="a server: http://HOST:PORT (kvdeck --serve, vLLM, or any OpenAI-"
                             "compatible server); several for the replicas of a deployment")
    parser.add_argument("--api-key", default=None,
                        help=f"the servers' bearer token (default: ${API_KEY_ENV}, then "
                             "$OPENAI_API_KEY)")
    add_record_arguments(parser)


def run_attach(args: argparse.Namespace) -> int:
    from kvdeck.app.attach.connection import normalise_url
    from kvdeck.tui.launch import run_attached

    try:
        urls = [normalise_url(url) for url in args.urls]
        record = record_options(args)
    except ValueError as exc:
        print(f"kvdeck attach: error: {exc}", file=sys.stderr)
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or os.environ.get("OPENAI_API_KEY")
    if record is None:
        return run_attached(urls, api_key)
    return run_attached(urls, api_key, record.path, record.max_mb)


COMMANDS = {  # name: (add_arguments, run); the help text is in kvdeck.app.cli
    "attach": (add_attach_arguments, run_attach),
}
