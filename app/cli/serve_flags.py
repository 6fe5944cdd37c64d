"""The flags of `kvdeck --serve`: only the server reads them, so the command line refuses them
without --serve (the TUI and the subcommands would silently ignore them)."""

import argparse

from kvdeck.app.serve.lora_adapters import parse_lora_module
from kvdeck.engine.frontend.reasoning import REASONING_FORMATS


def add_serve_arguments(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The server's flags, in their own --help group; returns their dests."""
    serve = parser.add_argument_group("server (with --serve)")
    actions = [
        serve.add_argument("--host", default="127.0.0.1"),
        serve.add_argument("--port", type=int, default=8000),
        serve.add_argument("--api-key", default=None, help="require this bearer token"),
        serve.add_argument("--served-model-name", default=None,
                           help="the model's name in the API (default: its name in `kvdeck "
                                "models`, or its folder's)"),
        serve.add_argument("--max-queue-len", type=int, default=256,
                           help="waiting requests accepted before answering 429"),
        serve.add_argument("--allow-insecure-bind", action="store_true",
                           help="allow a non-loopback --host without --api-key"),
        serve.add_argument("--restart-engine", action=argparse.BooleanOptionalAction, default=True,
                           help="start a new engine when it crashes (default: on)"),
        serve.add_argument("--engine-restart-delay", type=float, default=1.0,
                           help="seconds before restarting a crashed engine, doubled while "
                                "restarts fail"),
        serve.add_argument("--max-request-body-mb", type=float, default=4.0,
                           help="larger request bodies get 413 before they are parsed (default: 4)"),
        serve.add_argument("--shutdown-grace-period", type=float, default=10.0, metavar="S",
                           help="on SIGTERM, seconds streams may still run before they are ended "
                                "with an error event (default: 10)"),
        serve.add_argument("--tool-call-parser", choices=("hermes", "llama3_json", "mistral"),
                           default=None,
                           help="the format the model writes tool calls in (default: read from "
                                "its chat template)"),
        serve.add_argument("--reasoning-parser", choices=tuple(REASONING_FORMATS), default=None,
                           help="a thinking model's <think> block apart from its answer, in chat "
                                "replies' `reasoning` (qwen3: Qwen3; deepseek_r1: DeepSeek-R1, its "
                                "distills, QwQ: their template opens the block)"),
        serve.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                           help="browser origins allowed by CORS, e.g. http://localhost:3000 or "
                                "'*' (default: none)"),
        serve.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=None,
                           metavar="NAME=DIR",
                           help="LoRA adapters (PEFT folders) served by name, with --enable-lora; "
                                "also vLLM's JSON form '{\"name\": .., \"path\": ..}'"),
        serve.add_argument("--allow-runtime-lora", action="store_true",
                           help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                                "(vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"),
    ]
    return frozenset(action.dest for action in actions)


def serve_only_error(given: list[tuple[str, argparse.Action]], serve_only: frozenset[str]) -> str | None:
    """The error for server flags given without --serve (None if there are none)."""
    misplaced = list(dict.fromkeys(flag for flag, action in given if action.dest in serve_only))
    if not misplaced:
        return None
    verb = "applies" if len(misplaced) == 1 else "apply"
    return f"{', '.join(misplaced)} only {verb} with --serve"
