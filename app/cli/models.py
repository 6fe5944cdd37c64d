"""`kvdeck pull ID`, `kvdeck models`, `kvdeck rm ID`: the model store (kvdeck.app.store) from the
terminal."""

import argparse
import json
import shutil
import sys
import time
from typing import TextIO

from kvdeck.app.cli.default_model import DefaultModel, default_model_status
from kvdeck.app.cli.gguf import importable_json, print_importable
from kvdeck.app.store import local_models, paths
from kvdeck.app.store.cpu_plan import cpu_features
from kvdeck.app.store.download import DownloadError, download_model
from kvdeck.app.store.download_progress import (
    CancelToken,
    DownloadCancelled,
    DownloadProgress,
    format_bytes,
    format_eta,
)
from kvdeck.app.store.recommended import RECOMMENDED, format_params, memory_estimate, num_parameters
from kvdeck.kernels.w4a16_choice import is_w4a16, w4a16_serving_kernel


class TerminalProgress:
    """One redrawn line (bar, bytes, speed, ETA, current file) and a line per finished file."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.is_tty = out.isatty()
        self._reported: set[str] = set()
        self._last_draw = 0.0

    def __call__(self, p: DownloadProgress) -> None:
        for f in p.files:
            if f.state == "done" and f.name not in self._reported:
                self._reported.add(f.name)
                self._clear()
                self.out.write(f"  done  {f.name} ({format_bytes(f.size)})\n")
        now = time.monotonic()
        if self.is_tty and (now - self._last_draw > 0.1 or p.phase == "done"):
            self._last_draw = now
            self._draw(p)
        self.out.flush()

    def _draw(self, p: DownloadProgress) -> None:
        width = shutil.get_terminal_size((80, 24)).columns
        stats = (
            f" {format_bytes(p.done_bytes)}/{format_bytes(p.total_bytes)}"
            f" {format_bytes(p.speed_bps)}/s ETA {format_eta(p.eta_s)} {p.phase}"
        )
        bar_width = max(10, min(40, width - len(stats) - 8))
        filled = int(bar_width * p.fraction)
        line = f"[{'#' * filled}{'.' * (bar_width - filled)}] {100 * p.fraction:3.0f}%{stats}"
        current = next((f for f in p.files if f.name == p.current_file), None)
        if current is not None and current.state != "done" and current.size:
            line += f" {current.name} {100 * current.done / current.size:3.0f}%"
        self.out.write("\r" + line[: width - 1].ljust(width - 1))

    def _clear(self) -> None:
        if self.is_tty:
            width = shutil.get_terminal_size((80, 24)).columns
            self.out.write("\r" + " " * (width - 1) + "\r")

    def finish(self) -> None:
        self._clear()
        self.out.flush()


def _add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo_id", help="hub model id, e.g. Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    parser.add_argument("--allow-unsupported", action="store_true",
                        help="download even if kvdeck does not implement the architecture")


def run_pull(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    print(f"pulling {args.repo_id}@{args.revision} from {paths.hf_endpoint()}", file=out)
    print(f"into {paths.hf_hub_cache()}", file=out)
    progress = TerminalProgress(out)
    cancel = CancelToken()
    try:
        model = download_model(args.repo_id, args.revision, on_progress=progress, cancel=cancel,
                               allow_unsupported=args.allow_unsupported)  # fmt: skip
    except (KeyboardInterrupt, DownloadCancelled):
        progress.finish()
        print("kvdeck: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except DownloadError as exc:
        progress.finish()
        print(f"kvdeck: error: {exc}", file=sys.stderr)
        return 1
    progress.finish()
    print(f"verified {model.name} ({model.architecture}, {format_params(model.num_params)} params,"
          f" {format_bytes(model.size_bytes)})", file=out)  # fmt: skip
    print(f"path: {model.path}", file=out)
    return 0


def _add_models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recommended", action="store_true",
                        help="also list models recommended for one GPU, with memory needs")
    parser.add_argument("--context", type=int, default=8192,
                        help="context length for the memory estimate (default 8192)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION")
    add = actions.add_parser("add", help="add a model folder from elsewhere on disk to the list",
                             description="List a model folder (config.json + safetensors) "
                                         "without copying it; `kvdeck rm NAME` takes it off "
                                         "the list again and leaves the files alone.")
    add.add_argument("folder", help="the model's directory")
    add.add_argument("--name", default=None, help="the name to list it as (default: the folder's)")


def run_models(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if getattr(args, "models_action", None) == "add":
        return _run_models_add(args, out)
    models = local_models.list_models()
    bundled = local_models.bundled_models()
    pending = local_models.pending_downloads()
    free = local_models.free_disk_bytes()
    default = default_model_status()
    w4a16 = serving_kernel_here() if any(is_w4a16(m.quantization) for m in models) else None
    if args.json:
        data = {
            "models": [{**_model_json(m), "w4a16_kernel": w4a16 if is_w4a16(m.quantization) else None}
                       for m in models],
            "bundled": [_model_json(m) for m in bundled],
            "pending": [{"repo_id": p.repo_id, "bytes_on_disk": p.bytes_on_disk} for p in pending],
            "free_disk_bytes": free,
            "default": {"name": default.name, "installed": default.path is not None,
                        "path": str(default.path) if default.path else None,
                        "fallback": bundled[0].name if bundled else None},
        }
        if args.recommended:
            data["recommended"] = [_recommended_json(r, args.context) for r in RECOMMENDED]
        data["importable"] = importable_json()
        json.dump(data, out, indent=1)
        out.write("\n")
        return 0
    rows = [("NAME", "ARCH", "PARAMS", "DTYPE", "QUANT", "SIZE", "OK", "SOURCE")]
    for m in models:
        rows.append((m.name, m.architecture, format_params(m.num_params), m.dtype,
                     m.quant_label, format_bytes(m.size_bytes),
                     "yes" if m.supported else "no", _source(m, default)))  # fmt: skip
    if models:
        _print_table(rows, out)
    if w4a16 is not None:
        print(f"W4A16 (AWQ/GPTQ INT4) models run on: {w4a16}", file=out)
    if not models:
        print("no local models; try `kvdeck pull Qwen/Qwen2.5-0.5B-Instruct`", file=out)
    print(_default_line(default, bundled), file=out)
    for m in bundled:
        print(f"bundled with kvdeck: {m.name} ({m.architecture}, {format_params(m.num_params)}"
              f" params, {format_bytes(m.size_bytes)}; `--model demo`)", file=out)  # fmt: skip
    for p in pending:
        print(f"incomplete download: {p.repo_id} ({format_bytes(p.bytes_on_disk)} on disk;"
              f" `kvdeck pull {p.repo_id}` resumes it)", file=out)  # fmt: skip
    print(f"free disk: {format_bytes(free)} in {paths.hf_hub_cache()}", file=out)
    print_importable(out)
    if args.recommended:
        print(f"\nrecommended for one GPU (memory for one {args.context}-token sequence):", file=out)
        rec = [("REPO", "PARAMS", "QUANT", "WEIGHTS", "TOTAL", "")]
        for r in RECOMMENDED:
            est = memory_estimate(r, args.context)
            rec.append((r.repo_id, format_params(num_parameters(r.arch)), r.quantization or "-",
                        format_bytes(est.weight_bytes), format_bytes(est.total_bytes),
                        "gated" if r.gated else ""))  # fmt: skip
        _print_table(rec, out)
    return 0


def serving_kernel_here() -> str:
    """The W4A16 kernel the engine would run here: the GPU as torch sees it, as the engine does."""
    import torch  # only when a W4A16 model is listed: the listing otherwise needs no torch

    return w4a16_serving_kernel(on_cuda=torch.cuda.is_available(),
                                cpu_int4=cpu_features().int4_kernels)


def _source(m: local_models.LocalModel, default: DefaultModel) -> str:
    is_default = default.path is not None and m.path.resolve() == default.path.resolve()
    return f"{m.source} (default)" if is_default else m.source


def _default_line(default: DefaultModel, bundled: list[local_models.LocalModel]) -> str:
    """What `kvdeck` with no --model opens, and what it does when that is not installed."""
    if default.path is not None:
        return f"default (no --model): {default.name}"
    fallback = f"the bundled {bundled[0].name}" if bundled else "the bundled demo model"
    return (f"default (no --model): {default.name}, not installed yet; the first `kvdeck` without "
            f"--model fetches it ({default.source}) and imports it, or opens {fallback} if it "
            "cannot be had")


def _run_models_add(args: argparse.Namespace, out: TextIO) -> int:
    try:
        model = local_models.add_folder(args.folder, args.name)
    except ValueError as exc:
        print(f"kvdeck: error: {exc}", file=sys.stderr)
        return 1
    print(f"added {model.name} ({model.architecture}, {format_params(model.num_params)} params,"
          f" {format_bytes(model.size_bytes)}) from {model.path}", file=out)  # fmt: skip
    return 0


def _add_rm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="model name as `kvdeck models` lists it (an added folder is "
                                     "only taken off the list)")
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def run_rm(args: argparse.Namespace, out: TextIO | None = None, stdin: TextIO | None = None) -> int:
    out, stdin = out or sys.stdout, stdin or sys.stdin
    model = local_models.find_model(args.name)
    pending = {p.repo_id for p in local_models.pending_downloads()}
    if model is None and args.name not in pending:
        print(f"kvdeck: error: no local model named {args.name!r} (see `kvdeck models`)",
              file=sys.stderr)  # fmt: skip
        return 1
    if model is not None and model.source == "bundled":
        print(f"kvdeck: error: {model.name} is part of kvdeck and cannot be deleted", file=sys.stderr)
        return 1
    if model is not None and model.source == "folder":  # the files are the user's: unlist only
        local_models.delete_model(model.name)
        print(f"took {model.name} off the list; {model.path} is left as it was", file=out)
        return 0
    what = f"{model.name} ({format_bytes(model.size_bytes)}, {model.path})" if model else args.name
    if not args.yes:
        if not stdin.isatty():
            print("kvdeck: error: refusing to delete without confirmation; pass --yes",
                  file=sys.stderr)  # fmt: skip
            return 1
        out.write(f"delete {what}? [y/N] ")
        out.flush()
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("kept", file=out)
            return 1
    removed = local_models.delete_model(args.name)
    print(f"deleted {removed}", file=out)
    return 0


def _model_json(m: local_models.LocalModel) -> dict:
    return {"name": m.name, "path": str(m.path), "source": m.source,
            "architecture": m.architecture, "num_params": m.num_params, "dtype": m.dtype,
            "quantization": m.quantization, "size_bytes": m.size_bytes,
            "supported": m.supported, "verified": m.verified, "commit": m.commit,
            "origin": m.origin, "gguf_quantization": m.gguf_quantization}  # fmt: skip


def _recommended_json(r, context: int) -> dict:
    est = memory_estimate(r, context)
    return {"repo_id": r.repo_id, "num_params": num_parameters(r.arch),
            "quantization": r.quantization, "gated": r.gated,
            "weight_bytes": est.weight_bytes, "total_bytes": est.total_bytes}  # fmt: skip


def _print_table(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(),
              file=out)  # fmt: skip


COMMANDS = {  # name: (add_arguments, run); the help texts are in kvdeck.app.cli
    "pull": (_add_pull_arguments, run_pull),
    "models": (_add_models_arguments, run_models),
    "rm": (_add_rm_arguments, run_rm),
}
