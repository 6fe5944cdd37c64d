"""The engine's flags: one per EngineConfig field, for `kvdeck`, `kvdeck --serve` and the
in-process benchmarks (`kvdeck bench throughput|decode`)."""

import argparse
import json
from collections.abc import Callable
from dataclasses import MISSING, fields

from kvdeck.engine.types.config import EngineConfig

# Options that are not engine knobs on the command line.
_HIDDEN_ENGINE_FIELDS = {"model", "trust_remote_code"}


def add_engine_arguments(parser: argparse.ArgumentParser,
                         model_default: str = "SmolLM2-135M-Instruct, fetched on first use") -> None:
    """One flag per EngineConfig field, in kebab case (vLLM's names); `model_default` says
    what runs without --model."""
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=None,
                       help="a model as `kvdeck models` lists it, a model directory or a hub id; "
                            f"'demo' for the tiny bundled model (default: {model_default})")
    for f in fields(EngineConfig):
        if f.name in _HIDDEN_ENGINE_FIELDS:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = None if f.default is MISSING else f.default
        if isinstance(default, bool) or "bool" in str(f.type):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                               help=_FLAG_HELP.get(f.name, "") + f"(default: {default})")
            continue
        kind = _flag_type(f.type)
        group.add_argument(flag, type=kind, default=None,
                           help=_FLAG_HELP.get(f.name, "") + f"(default: {default})")


_FLAG_HELP = {  # the flags whose value a name alone does not explain
    "kv_offload_gib": "GiB of host memory keeping KV blocks evicted from the pool, copied back on a "
                      "prefix hit instead of recomputed (0: off) ",
    "kv_cache_dir": "a folder keeping full KV blocks across restarts (a resumed chat skips its "
                    "prefill); the TUI's default is the user cache dir's kv/ ('off': none), the "
                    "server's none ",
    "kv_cache_dir_gib": "the --kv-cache-dir folder's size bound; least recently used blocks go first ",
    "speculative_config": "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 4}', '{\"method\": \"suffix\"}' or "
                          "'{\"model\": \"demo-draft\", \"num_speculative_tokens\": 3}'; '{\"method\": "
                          "\"auto\"}' keeps suffix drafts only where they pay (the TUI's default); "
                          "'off': none ",
    "cpu_threads": "threads of the CPU kernels; unset: adaptive, up to torch's count (OMP_NUM_THREADS), "
                   "fewer while other processes keep cores busy ",
    "async_scheduling": "schedule and prepare the next step while the device runs this one; unset: "
                        "on with CUDA, off on the CPU ",
    "preemption_mode": "when the KV pool runs dry: swap (copy the newest request's blocks to host swap "
                       "space and back), recompute (drop them), auto (swap requests of 16+ computed "
                       "tokens while the swap space has room) ",
    "swap_space": "GiB of host memory for swapped-out KV blocks (at most half the free memory) ",
    "enable_lora": "serve LoRA adapters (PEFT folders) over the model: a request's lora_request, "
                   "or with --serve its model name (--lora-modules) ",
    "max_loras": "distinct LoRA adapters one step may use (device slots) ",
    "max_lora_rank": "the largest LoRA rank an adapter may have ",
    "max_cpu_loras": "LoRA adapters kept in host memory; unset: --max-loras ",
}


def _flag_type(annotation: object) -> Callable[[str], object]:
    text = str(annotation)
    if "dict" in text:
        return _json_object
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


OFF = "off"  # a JSON-typed flag's value that asks for none (where a default would apply)


def _json_object(text: str) -> dict | str:
    """A JSON-typed flag (--speculative-config '{...}', or 'off'); argparse reports the error."""
    if text.strip().lower() == OFF:
        return OFF
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def engine_kwargs_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The engine options the user actually set (others keep EngineConfig's defaults)."""
    kwargs: dict[str, object] = {}
    for f in fields(EngineConfig):
        if f.name in _HIDDEN_ENGINE_FIELDS:
            continue
        value = getattr(args, f.name, None)
        if value is not None and value != OFF:
            kwargs[f.name] = value
    return kwargs


def speculation_turned_off(args: argparse.Namespace) -> bool:
    """`--speculative-config off`: no speculation, not even the TUI's default."""
    return getattr(args, "speculative_config", None) == OFF
