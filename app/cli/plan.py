"""`kvdeck plan [FILE]`: the capacity planner (kvdeck.app.plan): the engine's own scheduler and
block manager in simulated time, on a recorded session or a synthetic workload, for the base
engine choice and each `--try` alternative; a table (or --json) and a verdict line.

    kvdeck plan --model Qwen3-8B --quant awq --gpu "RTX 4090" --context 8192 --users 16
    kvdeck plan session.kvrec --try block_size=32 --try num_blocks=2000
"""

from __future__ import annotations

import argparse
import json
import sys

PIPED_WIDTH = 160  # columns of the report when stdout is not a terminal


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", nargs="?", metavar="FILE",
                        help="a recording (--record): replay its requests, fit step costs to its steps")
    engine = parser.add_argument_group("the engine (the base choice)")
    engine.add_argument("--model", help="a model shape (Qwen3-8B, Llama-3.1-8B, ...; --list-models), "
                        "a local model directory or config.json, or a downloaded hub id")
    engine.add_argument("--quant", default="bf16", help="weights: bf16, fp16, awq, gptq, int8")
    engine.add_argument("--gpu", help='a card ("RTX 4090"; --list-gpus): sizes the pool and the '
                        "roofline step costs")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--num-blocks", type=int, help="the KV pool in blocks (instead of --gpu)")
    engine.add_argument("--block-size", type=int, help="default: the recording's, else 16")
    engine.add_argument("--kv-cache-dtype", default="auto", help="auto, bf16, fp16, fp8, int8")
    engine.add_argument("--max-num-seqs", type=int, help="default: the recording's, else 256")
    engine.add_argument("--max-num-batched-tokens", type=int,
                        help="the token budget (default: 8192 with --gpu, else 2048 or the recording's)")
    engine.add_argument("--context", "--max-model-len", dest="context", type=int,
                        help="max_model_len: each conversation grows to this")
    engine.add_argument("--no-prefix-caching", action="store_true")
    engine.add_argument("--preemption-mode", choices=("recompute", "swap", "auto"),
                        help="default: the engine's")
    work = parser.add_argument_group("a synthetic workload (users x turns; seeded)")
    work.add_argument("--users", type=int, help="concurrent users (conversations)")
    work.add_argument("--turns", type=int, default=1, help="turns per conversation")
    work.add_argument("--prompt-len", help="first prompt tokens: N or LOW-HIGH (default: what "
                      "makes the last turn fill --context)")
    work.add_argument("--turn-len", default="128", help="each later turn's new tokens: N or LOW-HIGH")
    work.add_argument("--output-len", default="256", help="tokens each turn generates: N or LOW-HIGH")
    work.add_argument("--shared-prefix", type=int, default=0,
                      help="tokens of a system prompt every user's first prompt starts with")
    work.add_argument("--rate", type=float, help="users arrive as a Poisson process, per second")
    work.add_argument("--ramp", type=float, default=0.0, help="else users start within this many s")
    work.add_argument("--think-time", type=float, default=0.0,
                      help="mean seconds between a reply and the user's next turn (exponential)")
    work.add_argument("--seed", type=int, default=0)
    engine.add_argument("--calibrate", action="store_true",
                        help="fit the step costs to a short run of the real engine on this machine "
                             "(the --model directory, or the demo model; loads torch)")
    out = parser.add_argument_group("the comparison")
    out.add_argument("--try", dest="tries", action="append", default=[], metavar="KEY=VALUE[,...]",
                     help="an alternative (repeatable): block_size, num_blocks, gpu, kv_cache_dtype, "
                          "max_num_seqs, max_num_batched_tokens, enable_prefix_caching=on|off, "
                          "preemption_mode, max_model_len")
    out.add_argument("--ttft-slo", type=float, help="p99 TTFT target in seconds for the verdict")
    out.add_argument("--json", action="store_true", help="the report as JSON")
    out.add_argument("--list-gpus", action="store_true", help="the known cards, then exit")
    out.add_argument("--list-models", action="store_true", help="the known model shapes, then exit")


def run_plan(args: argparse.Namespace) -> int:
    from kvdeck.app.plan.planner import PlanOptions, plan

    if args.list_gpus or args.list_models:
        return _list(args)
    options = PlanOptions(
        recording=args.recording, model=args.model, quant=args.quant.lower(), gpu=args.gpu,
        gpu_memory_utilization=args.gpu_memory_utilization, num_blocks=args.num_blocks,
        block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.context, enable_prefix_caching=not args.no_prefix_caching,
        preemption_mode=args.preemption_mode, users=args.users, turns=args.turns,
        prompt_len=args.prompt_len, turn_len=args.turn_len, output_len=args.output_len,
        shared_prefix=args.shared_prefix, rate=args.rate, ramp_s=args.ramp,
        think_time_s=args.think_time, seed=args.seed, tries=args.tries, ttft_slo_s=args.ttft_slo)
    try:
        if args.calibrate:
            from kvdeck.app.bench.plan_check import calibrate

            options.model = options.model or "demo"
            options.cost_model = calibrate(options.model, options.max_num_seqs or 256,
                                           options.max_num_batched_tokens)
        report = plan(options)
    except ValueError as exc:  # a bad option or file: named, without a traceback
        print(f"kvdeck plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        from rich.console import Console

        from kvdeck.app.plan.report import render

        # Piped or redirected, Rich would wrap at 80 columns and cut the table's cells short.
        render(report, Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH))
    return 0


def _list(args: argparse.Namespace) -> int:
    from kvdeck.app.plan.gpus import GPUS
    from kvdeck.app.plan.model_shapes import NAMED_SHAPES

    if args.list_gpus:
        for gpu in GPUS:
            print(f"{gpu.name:14} {gpu.memory_gib:6.1f} GiB {gpu.bandwidth_gb_s:6.0f} GB/s "
                  f"{gpu.bf16_tflops:6.1f} bf16 TFLOPS")
    if args.list_models:
        for shape in NAMED_SHAPES.values():
            print(f"{shape.name:14} {shape.num_params / 1e9:6.2f} B params, {shape.num_layers} layers, "
                  f"KV {shape.kv_bytes_per_token('auto') // 1024} KiB/token (16-bit)")
    return 0


COMMANDS = {  # name: (add_arguments, run); the help text is in kvdeck.app.cli
    "plan": (add_plan_arguments, run_plan),
}
