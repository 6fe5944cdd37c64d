"""`kvdeck quantize SOURCE` and `kvdeck eval-ppl`: INT4 (AWQ or RTN) into kvdeck's model store,
unless --out says where, and the perplexity of a model on a text file.

Writing into the store (through a staging folder, renamed when complete, registered with
the model it came from: kvdeck.app.jobs.quantize) is what lets the TUI's Models screen list,
compare, load and delete the result. SOURCE is a listed model's name or any model directory.
The store's modules are imported only when they are needed, so `--out` runs where only the
quantiser's dependencies are installed.
"""

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from kvdeck.engine.types.config import DEVICES
from kvdeck.quant.awq_pipeline import METHODS
from kvdeck.quant.awq_quantizer import GROUP_SIZES, QuantizeProgress, QuantizeStep
from kvdeck.quant.progress_text import format_duration, format_remaining, remaining_seconds

BAR_WIDTH = 30


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="model directory (or hub id in the local cache)")
    parser.add_argument("--method", choices=METHODS, default="awq",
                        help="awq, or rtn: round to nearest, no calibration (the baseline AWQ beats)")
    parser.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=None,
                        help="INT4 group size (default: the largest of 128/64/32 that divides the "
                             "model's layer widths)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: into kvdeck's model store, where "
                             "`kvdeck models` and the TUI list it)")
    parser.add_argument("--name", default=None,
                        help="its name in kvdeck's store (default: <source name>-<method>)")
    parser.add_argument("--calib-file", default=None,
                        help="calibration text (default: assets/calibration/calibration.txt)")
    parser.add_argument("--num-samples", type=int, default=64,
                        help="calibration sequences of --seq-len tokens (default: 64)")
    parser.add_argument("--seq-len", type=int, default=512,
                        help="tokens per calibration sequence (default: 512)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where layers are quantised (default: cuda if available)")


def progress_bar(fraction: float, method: str = "awq") -> str:
    """The bar, named after the method (AWQ, RTN)."""
    filled = int(BAR_WIDTH * min(max(fraction, 0.0), 1.0))
    return f"{method.upper()} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * fraction:3.0f}%"


def step_line(step: QuantizeStep, method: str = "awq") -> str:
    """The redrawn line: the bar, the step inside the layer, elapsed and what is left."""
    left = format_remaining(remaining_seconds(step.fraction, step.elapsed_s))
    return (f"{progress_bar(step.fraction, method)} {step.what} · {format_duration(step.elapsed_s)} "
            f"elapsed · {left}")


def progress_line(event: QuantizeProgress, method: str = "awq") -> str:
    """A line of its own for each finished layer."""
    return (f"{progress_bar(event.fraction(), method)} layer {event.layer}/{event.num_layers} done · "
            f"{format_duration(event.elapsed_s)} elapsed · ETA {format_remaining(event.eta_s)}")


class TerminalProgress:
    """Steps redraw one line on a terminal (a line every LOG_EVERY_S into a file); each
    finished layer gets a line of its own."""

    LOG_EVERY_S = 15.0

    def __init__(self, stream: TextIO, method: str = "awq") -> None:
        self.method = method
        self.stream = stream
        self.is_tty = stream.isatty()
        self.last_logged = -self.LOG_EVERY_S
        self.width = 0

    def step(self, step: QuantizeStep) -> None:
        line = step_line(step, self.method)
        if self.is_tty:
            self._redraw(line)
        elif step.elapsed_s - self.last_logged >= self.LOG_EVERY_S:
            self.last_logged = step.elapsed_s
            self.stream.write(line + "\n")
        self.stream.flush()

    def layer(self, event: QuantizeProgress) -> None:
        if self.is_tty:
            self._redraw(progress_line(event, self.method))
        else:
            self.stream.write(progress_line(event, self.method))
        self.stream.write("\n")
        self.width = 0
        self.stream.flush()

    def _redraw(self, line: str) -> None:
        pad = max(0, self.width - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.width = len(line)


def run_quantize(args: argparse.Namespace, out_dir: str | None = None,
                 on_written: Callable[[Path], Path] | None = None) -> int:
    """Quantise `args.source` into `out_dir` (default `args.out`); `on_written` may move the
    result (into kvdeck's store) and returns where it ended up."""
    from kvdeck.quant.awq_pipeline import QuantizeJob, run_quantize_job

    job = QuantizeJob(
        source=args.source, out_dir=out_dir or args.out, calib_file=args.calib_file,
        num_samples=args.num_samples, seq_len=args.seq_len, device=args.device,
        group_size=args.group_size, method=args.method,
    )
    stream = sys.stderr
    show = TerminalProgress(stream, args.method)

    group = args.group_size or "auto"
    print(f"quantising {args.source} with {args.method.upper()} (4-bit, group {group}) ...", file=stream)
    start = time.monotonic()
    try:
        written = run_quantize_job(job, progress=show.layer, on_step=show.step)
        written = on_written(written) if on_written is not None else written
    except OSError as exc:
        print(f"\nkvdeck: error: {exc.strerror or exc}", file=stream)
        return 1
    except KeyboardInterrupt:
        print("\nkvdeck: interrupted; nothing was written", file=stream)
        return 130
    print(f"wrote {written} in {format_duration(time.monotonic() - start)}")
    return 0


def run_quantize_command(args: argparse.Namespace) -> int:
    from kvdeck.app.store import local_models

    source = local_models.find_model(args.source)
    if args.out is not None:  # a listed model's name works here too
        if source is not None:
            args.source = str(source.path)
        return run_quantize(args)
    from kvdeck.app.jobs.quantize import default_name, install_quantized, new_staging

    if source is not None:
        origin, origin_path = source.name, source.path
        name = args.name or default_name(source, args.method)
    else:  # a model folder kvdeck does not list: named after the folder
        folder = Path(args.source).expanduser()
        if not folder.is_dir():
            print(f"kvdeck: error: {args.source!r} is neither a listed model (see `kvdeck models`) "
                  "nor a model directory", file=sys.stderr)
            return 1
        origin, origin_path = folder.resolve().name, folder.resolve()
        name = args.name or f"{origin}-{args.method}"
    try:
        staging = new_staging(name)
    except ValueError as exc:
        print(f"kvdeck: error: {exc} (pass --name or --out)", file=sys.stderr)
        return 1
    args.source = str(origin_path)

    def install(written: Path) -> Path:
        return install_quantized(written, name, origin, str(origin_path), args.calib_file,
                                 args.method).path

    try:
        code = run_quantize(args, out_dir=str(staging / name), on_written=install)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if code == 0:
        print(f"added to kvdeck's model store as {name} (`kvdeck models` lists it)")
    return code


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model as `kvdeck models` lists it, 'demo', a model "
                                      "directory or a hub id in the cache (fp or AWQ)")
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
    from kvdeck.app.cli.default_model import model_dir_or_demo
    from kvdeck.quant.evaluate import evaluate_perplexity

    model = model_dir_or_demo(args.model)  # `demo` and store names, as `kvdeck --model`
    result, kind, device = evaluate_perplexity(model, args.file, args.seq_len, args.max_windows,
                                               args.device, args.quantization)
    print(
        f"perplexity: {result.perplexity:.4f}  ({result.num_tokens} tokens, "
        f"{result.num_windows} windows of up to {args.seq_len}; {kind} on {device})"
    )
    return 0


COMMANDS = {  # name: (add_arguments, run); the help texts are in kvdeck.app.cli
    "quantize": (add_quantize_arguments, run_quantize_command),
    "eval-ppl": (add_eval_arguments, run_eval_ppl),
}
