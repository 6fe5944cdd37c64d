"""`kvdeck quantize` and `kvdeck eval-ppl` (registered by app/cli.py through COMMANDS)."""

import argparse
import sys
import time

from kvdeck.engine.types.config import DEVICES
from kvdeck.quant.awq_pipeline import METHODS
from kvdeck.quant.awq_quantizer import GROUP_SIZES, QuantizeProgress

BAR_WIDTH = 30


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="model directory (or hub id in the local cache)")
    parser.add_argument("--method", choices=METHODS, default="awq",
                        help="awq, or rtn: round to nearest, no calibration (the baseline AWQ beats)")
    parser.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=None,
                        help="INT4 group size (default: the largest of 128/64/32 that divides the "
                             "model's layer widths)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: <source>-<method> beside the source)")
    parser.add_argument("--calib-file", default=None,
                        help="calibration text (default: assets/calibration/calibration.txt)")
    parser.add_argument("--num-samples", type=int, default=128,
                        help="calibration sequences (default: 128)")
    parser.add_argument("--seq-len", type=int, default=512,
                        help="tokens per calibration sequence (default: 512)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where layers are quantised (default: cuda if available)")


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def progress_line(event: QuantizeProgress) -> str:
    filled = int(BAR_WIDTH * event.fraction())
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    return (
        f"AWQ [{bar}] layer {event.layer}/{event.num_layers}  "
        f"elapsed {format_seconds(event.elapsed_s)}  ETA {format_seconds(event.eta_s)}"
    )


def run_quantize(args: argparse.Namespace) -> int:
    from kvdeck.quant.awq_pipeline import QuantizeJob, run_quantize_job

    job = QuantizeJob(
        source=args.source, out_dir=args.out, calib_file=args.calib_file,
        num_samples=args.num_samples, seq_len=args.seq_len, device=args.device,
        group_size=args.group_size, method=args.method,
    )
    stream = sys.stderr

    def show(event: QuantizeProgress) -> None:
        end = "\n" if event.layer == event.num_layers else ""
        stream.write("\r" + progress_line(event) + end)
        stream.flush()

    group = args.group_size or "auto"
    print(f"quantising {args.source} with {args.method.upper()} (4-bit, group {group}) ...", file=stream)
    start = time.monotonic()
    try:
        out_dir = run_quantize_job(job, progress=show)
    except OSError as exc:
        print(f"\nkvdeck: error: {exc.strerror or exc}", file=stream)
        return 1
    except KeyboardInterrupt:
        print("\nkvdeck: interrupted; nothing was written", file=stream)
        return 130
    print(f"wrote {out_dir} in {format_seconds(time.monotonic() - start)}")
    return 0


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model directory (fp or AWQ checkpoint)")
    parser.add_argument("--file", required=True, help="text file to score")
    parser.add_argument("--seq-len", type=int, default=512,
                        help="tokens per scored window (default: 512)")
    parser.add_argument("--max-windows", type=int, default=None,
                        help="score at most this many windows (default: the whole file)")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--quantization", choices=("bnb-nf4",), default=None,
                        help="score a dense model with its weights NF4-quantised (bitsandbytes, "
                             "as the engine's bnb-nf4 runs them)")


def run_eval_ppl(args: argparse.Namespace) -> int:
    from kvdeck.quant.evaluate import evaluate_perplexity

    result, kind, device = evaluate_perplexity(args.model, args.file, args.seq_len, args.max_windows,
                                               args.device, args.quantization)
    print(
        f"perplexity: {result.perplexity:.4f}  ({result.num_tokens} tokens, "
        f"{result.num_windows} windows of up to {args.seq_len}; {kind} on {device})"
    )
    return 0


COMMANDS = {  # name: (add_arguments, run); the help texts are in kvdeck.app.cli
    "quantize": (add_quantize_arguments, run_quantize),
    "eval-ppl": (add_eval_arguments, run_eval_ppl),
}
