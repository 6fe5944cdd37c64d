"""`kvdeck` entry point: every subcommand's flags and output, one module per command group.

`kvdeck [--model M]` opens the TUI; `kvdeck --serve` runs the OpenAI-compatible server
(engine_flags.py holds the engine's flags, serve_flags.py the server's; parse_errors.py makes
the errors name the wrong word); subcommands come from the modules in
SUBCOMMANDS (models.py: pull, models, rm; gguf.py: import; quantize.py: quantize, eval-ppl;
bench.py; attach.py; plan.py), each exposing
`COMMANDS: dict[name, (add_arguments(parser), run(args) -> int)]` and calling into the
layer that does the work (the store, the jobs, the quantiser, the bench runners, the TUI).
A module is imported only when its command is on the command line (`kvdeck --help` imports
none), so the TUI's window appears before torch is loaded, and the benchmarks run on a
machine that has only torch, triton and transformers (the lent GPU image).
"""

import argparse
import importlib
import sys

from kvdeck.app.cli.engine_flags import add_engine_arguments, engine_kwargs_from_args, speculation_turned_off
from kvdeck.app.cli.parse_errors import CliParser, given_options
from kvdeck.app.cli.record_flags import add_record_arguments, record_options
from kvdeck.app.cli.serve_flags import add_serve_arguments, serve_only_error
from kvdeck.engine.types.config import EngineConfig

SUBCOMMANDS = {  # name: (module, help)
    "pull": ("kvdeck.app.cli.models", "download a model from the Hugging Face hub (resumable, verified)"),
    "models": ("kvdeck.app.cli.models",
               "list local models, free disk space and recommended models; `models add DIR`"),
    "rm": ("kvdeck.app.cli.models", "delete a local model"),
    "import": ("kvdeck.app.cli.gguf",
               "import a GGUF model (a file, or ollama:NAME[:TAG]) into kvdeck's store"),
    "quantize": ("kvdeck.app.cli.quantize",
                 "quantise a model to INT4 (AWQ, or RTN; AutoAWQ GEMM layout) into the store"),
    "eval-ppl": ("kvdeck.app.cli.quantize", "perplexity of a model (dense or AWQ) on a text file"),
    "bench": ("kvdeck.app.cli.bench",
              "benchmark throughput, serving latency or decode against the roofline"),
    "attach": ("kvdeck.app.cli.attach",
               "open the TUI on running servers (kvdeck --serve, vLLM): chat and dashboard"),
    "plan": ("kvdeck.app.cli.plan",
             "capacity planner: the real scheduler in simulated time on a recording or synthetic "
             "users, for other block sizes, pools (--gpu), KV dtypes and limits"),
    "replay": ("kvdeck.app.cli.replay",
               "replay a recorded session's dashboard (--record FILE), read-only, with a time slider"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in `argv` gets its module imported."""
    parser = CliParser(
        prog="kvdeck",
        usage="kvdeck [--model MODEL] [--serve] [OPTION ...] | kvdeck COMMAND ...",
        description="Local LLM engine with a live view of its paged KV cache.",
    )
    parser.add_argument("--serve", action="store_true", help="run the OpenAI-compatible server")
    add_engine_arguments(parser)
    serve_only = add_serve_arguments(parser)
    add_record_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", prog="kvdeck")
    handlers = {}
    named = set(argv or ()) & set(SUBCOMMANDS)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name not in named:
            continue  # listed in --help; its module is imported only when it is used
        add_arguments, run = importlib.import_module(module_name).COMMANDS[name]
        add_arguments(sub)
        handlers[name] = run
    parser.set_defaults(_handlers=handlers, _serve_only=serve_only)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args._argv = list(argv)  # what a benchmark's JSON records as its command
    if not args.serve:
        misplaced = serve_only_error(given_options(parser, argv), args._serve_only)
        if misplaced:
            parser.error(misplaced)
    try:
        if args.command:
            return int(args._handlers[args.command](args) or 0)
        engine_kwargs = engine_kwargs_from_args(args)
        EngineConfig.from_kwargs(None, **engine_kwargs)  # fail fast on bad flags
        record = record_options(args)  # and on a recording that cannot be written
        from kvdeck.app.cli.default_model import default_model

        requested_model = args.model
        args.model = default_model(args.model)
        if args.serve:
            from kvdeck.app.serve.server import run_server

            return run_server(args, engine_kwargs, requested_model)
        from kvdeck.tui.launch import run_tui

        return run_tui(args.model, engine_kwargs, default_speculation=not speculation_turned_off(args),
                       record_to=record.path if record else None,
                       record_max_mb=record.max_mb if record else 20.0)
    except ValueError as exc:
        print(f"kvdeck: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
