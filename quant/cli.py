"""`kvdeck eval-ppl`, and the quantiser's side of `kvdeck quantize` (its arguments, its
progress bar, the run into a directory); app/jobs/quantize_command.py adds the store."""

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvdeck.engine.types.config import DEVICES
from kvdeck.quant.awq_quantizer import QuantizeProgress

BAR_WIDTH = 30


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="model directory (or hub id in the local cache)")
    parser.add_argument("--method", choices=("awq",), default="awq",
                        help="quantisation method (default: awq)")
    parser.add_argument("--out", default=None,
                        help="output directory (default: into kvdeck's model store, where "
                             "`kvdeck models` and the TUI list it)")
    parser.add_argument("--name", default=None,
                        help="its name in kvdeck's store (default: <source name>-awq)")
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


def run_quantize(args: argparse.Namespace, out_dir: str | None = None,
                 on_written: Callable[[Path], Path] | None = None) -> int:
    """Quantise `args.source` into `out_dir` (default `args.out`); `on_written` may move the
    result (into kvdeck's store) and returns where it ended up."""
    from kvdeck.quant.awq_pipeline import QuantizeJob, run_quantize_job

    job = QuantizeJob(
        source=args.source, out_dir=out_dir or args.out, calib_file=args.calib_file,
        num_samples=args.num_samples, seq_len=args.seq_len, device=args.device,
    )
    stream = sys.stderr

    def show(event: QuantizeProgress) -> None:
        end = "\n" if event.layer == event.num_layers else ""
        stream.write("\r" + progress_line(event) + end)
        stream.flush()

    print(f"quantising {args.source} with AWQ (4-bit, group 128) ...", file=stream)
    start = time.monotonic()
    try:
        written = run_quantize_job(job, progress=show)
        written = on_written(written) if on_written is not None else written
    except OSError as exc:
        print(f"\nkvdeck: error: {exc.strerror or exc}", file=stream)
        return 1
    except KeyboardInterrupt:
        print("\nkvdeck: interrupted; nothing was written", file=stream)
        return 130
    print(f"wrote {written} in {format_seconds(time.monotonic() - start)}")
    return 0


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model directory (fp or AWQ checkpoint)")
    parser.add_argument("--file", required=True, help="text file to score")
    parser.add_argument("--seq-len", type=int, default=512,
                        help="tokens per scored window (default: 512)")
    parser.add_argument("--max-windows", type=int, default=None,
                        help="score at most this many windows (default: the whole file)")
    parser.add_argument("--device", choices=DEVICES, default="auto")


def run_eval_ppl(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvdeck.quant.awq_pipeline import pick_device, resolve_model_dir
    from kvdeck.quant.hf_int4 import load_awq_into_transformers
    from kvdeck.quant.perplexity import hf_logits_fn, perplexity

    model_dir = resolve_model_dir(args.model)
    text_path = Path(args.file)
    if not text_path.is_file():
        raise ValueError(f"--file {args.file!r} does not exist")
    if args.max_windows is not None and args.max_windows <= 0:
        raise ValueError(f"--max-windows must be > 0, got {args.max_windows}")
    device = pick_device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    config = json.loads((model_dir / "config.json").read_text())
    quant_method = (config.get("quantization_config") or {}).get("quant_method")
    if quant_method == "awq":
        # kvdeck's INT4 linear layers inside the transformers model of the architecture.
        model = load_awq_into_transformers(model_dir, device, dtype)
        kind = "AWQ INT4 (kvdeck W4A16 layers)"
    elif quant_method is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        kind = f"dense {str(dtype).replace('torch.', '')}"
    else:
        raise ValueError(f"cannot evaluate quant_method {quant_method!r}; kvdeck reads AWQ")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = text_path.read_text(encoding="utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    result = perplexity(hf_logits_fn(model), ids, args.seq_len, args.max_windows)
    print(
        f"perplexity: {result.perplexity:.4f}  ({result.num_tokens} tokens, "
        f"{result.num_windows} windows of up to {args.seq_len}; {kind} on {device.type})"
    )
    return 0


# `kvdeck quantize` itself is kvdeck.app.jobs.quantize_command: it writes into the model
# store, which lives in the app layer above this one.
COMMANDS = {  # name: (add_arguments, run); the help texts are in kvdeck.app.cli
    "eval-ppl": (add_eval_arguments, run_eval_ppl),
}
