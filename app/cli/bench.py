"""`kvdeck bench throughput|serve|decode`: speed figures against a baseline in the same run.

The flags of all three (and of the llama.cpp baseline they share) are here; throughput and
decode run in this process (bench_runs.py), serve against a running server
(kvdeck.app.bench.serve).
"""

import argparse

from kvdeck.app.cli.bench_runs import run_decode, run_throughput
from kvdeck.app.cli.engine_flags import add_engine_arguments
from kvdeck.app.cli.parse_errors import CliParser

WORKLOADS = ("random", "grounded", "agentic", "chat")
WORKLOAD_HELP = ("random: random token ids; grounded: continue a passage of the bundled docs text that "
                 "is in the prompt (app/bench/grounded.py; what speculative decoding predicts); "
                 "agentic: continue a coding agent's transcript of repetitive JSON tool calls and "
                 "edits (app/bench/agentic.py; what suffix decoding predicts); chat: answer ordinary "
                 "questions in the chat template (app/bench/chat.py; nothing to copy)")
SPEC_HELP = ("with --speculative-config, both sides run in this process: the engine with and without "
             "speculative decoding, alternating, and the JSON holds the speedup and acceptance")


# Flags whose value may itself start with a dash (`--llama-cpp-args --no-repack`): argparse
# would take such a value for an option of its own and refuse the flag as missing its value.
DASH_VALUE_FLAGS = ("--llama-cpp-args",)


class _BenchParser(CliParser):
    """A bench subcommand's parser: a DASH_VALUE_FLAGS flag takes the next word as its value,
    whatever it starts with (joined as `--flag=value` before argparse sees it)."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(join_dash_values(args), namespace)


def join_dash_values(args: list[str] | None) -> list[str] | None:
    if args is None:
        return None
    joined, index = [], 0
    while index < len(args):
        arg = args[index]
        if arg in DASH_VALUE_FLAGS and index + 1 < len(args) and args[index + 1].startswith("-"):
            joined.append(f"{arg}={args[index + 1]}")
            index += 2
            continue
        if arg == "--":  # what follows is positional, as argparse has it
            joined += args[index:]
            break
        joined.append(arg)
        index += 1
    return joined


BENCH_MODEL_DEFAULT = "the bundled demo model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="{throughput,serve,decode}",
                                required=True, parser_class=_BenchParser)
    tp = sub.add_parser("throughput", help="offline throughput on a synthetic or file workload",
                        epilog=SPEC_HELP)
    add_engine_arguments(tp, model_default=BENCH_MODEL_DEFAULT)
    _add_workload_arguments(tp, with_seed=False)  # the engine's --seed seeds the workload too
    tp.add_argument("--prompts-file", default=None, help="one prompt per line instead of random tokens")
    tp.add_argument("--baseline", choices=["hf", "llama.cpp", "none"], default="none",
                    help="also run Hugging Face transformers generate, or llama.cpp's server, on "
                         "the same requests")
    tp.add_argument("--baseline-batch-size", type=int, default=None,
                    help="static batch size of the baseline (default: what fits)")
    tp.add_argument("--repeats", type=int, default=1,
                    help="time each side this many times and report its median run (noisy machines)")
    tp.add_argument("--workload", choices=WORKLOADS, default="random", help=WORKLOAD_HELP)
    _add_llama_cpp_arguments(tp)

    sv = sub.add_parser("serve", help="online latency and throughput against a running server")
    _add_serve_arguments(sv)
    _add_workload_arguments(sv)
    dc = sub.add_parser("decode", help="one sequence's decode speed against the memory-bandwidth "
                                       "roofline", epilog=SPEC_HELP)
    add_engine_arguments(dc, model_default=BENCH_MODEL_DEFAULT)
    dc.add_argument("--input-len", type=int, default=128, help="prompt tokens (random ids)")
    dc.add_argument("--output-len", type=int, default=256, help="tokens to generate")
    dc.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    dc.add_argument("--workload", choices=WORKLOADS, default="random", help=WORKLOAD_HELP)
    dc.add_argument("--out", default=None, help="write the JSON result here")
    dc.add_argument("--contention", type=int, default=0, metavar="N",
                    help="also decode with N other processes each keeping one CPU busy (pinned to the "
                         "last N CPUs, started for those runs and stopped after), quiet and busy in "
                         "turns; reports each side's busy/quiet speed (with --baseline, llama.cpp's too)")
    dc.add_argument("--baseline", choices=["llama.cpp", "llama-bench", "none"], default="none",
                    help="also decode the same prompt with llama.cpp, in turns with kvdeck: llama.cpp "
                         "runs llama-server; llama-bench runs llama.cpp's llama-bench (-p 0 -n "
                         "OUTPUT_LEN -d INPUT_LEN -r 1), where the server cannot run. On an INT4 "
                         "model without --llama-cpp-gguf, the 4-bit GGUF it (or the model it was "
                         "quantised from) was imported from")
    _add_llama_cpp_arguments(dc)


def _add_workload_arguments(parser: argparse.ArgumentParser, with_seed: bool = True) -> None:
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", default="100:1024", help="MIN:MAX prompt tokens")
    parser.add_argument("--output-len", default="100:1024", help="MIN:MAX output tokens")
    if with_seed:
        parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON result here")
    parser.add_argument("--plot", default=None, help="draw the figures into this PNG")


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The server under test and the load on it (kvdeck.app.bench.serve reads them)."""
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="served model name (default: the first listed)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (default: all at once)")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--baseline", choices=["llama.cpp", "none"], default="none",
                        help="also send the same requests to llama.cpp's server, in turns")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of the workload per side (in turns with a baseline)")
    parser.add_argument("--llama-cpp-parallel", type=int, default=32,
                        help="llama-server slots (requests it runs at once; the rest queue)")
    parser.add_argument("--llama-cpp-slot-context", type=int, default=None,
                        help="tokens per llama-server slot (default: the longest request)")
    _add_llama_cpp_arguments(parser, running_server=True)


def _add_llama_cpp_arguments(parser: argparse.ArgumentParser, running_server: bool = False) -> None:
    """The flags that say which llama.cpp to run, on which GGUF, with how many threads
    (kvdeck.app.bench.llama_cpp reads them)."""
    group = parser.add_argument_group("llama.cpp baseline (--baseline llama.cpp)")
    group.add_argument("--llama-cpp-gguf", default=None,
                       help="the same model as GGUF (python benchmarks/llama_cpp.py convert MODEL OUT.gguf; "
                            "for an INT4 model, quantize MODEL OUT.gguf --type Q4_1). Default for an "
                            "INT4 model (decode, throughput): the 4-bit GGUF it or its dense origin "
                            "was imported from")
    group.add_argument("--llama-cpp-bin", default=None,
                       help="folder holding llama-server (default: $KVDECK_LLAMA_CPP_DIR/build/bin, "
                            "else the newest build under ~/.cache/kvdeck/llama.cpp)")
    group.add_argument("--llama-cpp-threads", type=int, default=None,
                       help="llama.cpp's threads (default: as many as kvdeck's torch uses)")
    group.add_argument("--llama-cpp-args", action="append", default=[],
                       help="more llama.cpp flags, as one string split as a shell would "
                            "(\"--poll 0\", --llama-cpp-args=--no-repack or --llama-cpp-args "
                            "--no-repack); may be repeated")
    group.add_argument("--llama-cpp-repack", type=int, choices=(0, 1), default=None,
                       help="llama.cpp's weight repacking at load: 0 off (--no-repack; llama-bench's "
                            "--repack 0), 1 on (default: llama.cpp's, on)")
    if running_server:
        group.add_argument("--llama-cpp-url", default=None,
                           help="a llama-server already running (instead of starting one)")


def run(args: argparse.Namespace) -> int:
    if args.bench_command in ("throughput", "decode") and args.model is not None:
        from kvdeck.app.cli.default_model import named_model

        args.model = named_model(args.model)  # a store name as `kvdeck --model` takes it
    if args.bench_command == "decode":
        return run_decode(args)
    if args.num_prompts <= 0:
        raise ValueError(f"--num-prompts must be positive, got {args.num_prompts}")
    if args.bench_command == "serve":
        from kvdeck.app.bench.serve import run_serve_benchmark

        return run_serve_benchmark(args)
    return run_throughput(args)


COMMANDS = {"bench": (add_arguments, run)}  # the help text is in kvdeck.app.cli
