"""`kvdeck import FILE.gguf | ollama:NAME[:TAG]`, and the importable GGUFs `kvdeck models` lists."""

import argparse
import shutil
import sys
import time
from typing import TextIO

from kvdeck.app.store.download_progress import format_bytes
from kvdeck.app.store.gguf.discovery import ImportableGGUF, find_importable, resolve_source
from kvdeck.app.store.gguf.header import GGUFImportError
from kvdeck.app.store.gguf.importer import DTYPES, ImportCancelled, ImportProgress, import_gguf
from kvdeck.app.store.recommended import format_params


class ImportBar:
    """One redrawn line on a terminal (bar, tensors, bytes, current tensor); phase lines otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.is_tty = out.isatty()
        self._phase = ""
        self._last_draw = 0.0

    def __call__(self, p: ImportProgress) -> None:
        if p.phase != self._phase:
            self._phase = p.phase
            self._clear()
            if p.phase in ("reading", "tokenizer", "tensors"):
                self.out.write(f"  {_PHASE_TEXT[p.phase]}\n")
        now = time.monotonic()
        if self.is_tty and p.phase == "tensors" and (now - self._last_draw > 0.1 or p.fraction >= 1):
            self._last_draw = now
            self.out.write("\r" + self.line(p, shutil.get_terminal_size((80, 24)).columns))
        self.out.flush()

    @staticmethod
    def line(p: ImportProgress, width: int) -> str:
        stats = (f" {100 * p.fraction:3.0f}% {p.tensors_done}/{p.tensors_total} tensors"
                 f" {format_bytes(p.bytes_done)}/{format_bytes(p.bytes_total)}")  # fmt: skip
        bar_width = max(10, min(40, width - len(stats) - len(p.current or "") - 4))
        filled = int(bar_width * p.fraction)
        text = f"[{'#' * filled}{'.' * (bar_width - filled)}]{stats} {p.current or ''}"
        return text[: width - 1].ljust(width - 1)

    def _clear(self) -> None:
        if self.is_tty:
            width = shutil.get_terminal_size((80, 24)).columns
            self.out.write("\r" + " " * (width - 1) + "\r")

    def finish(self) -> None:
        self._clear()
        self.out.flush()


_PHASE_TEXT = {
    "reading": "reading the GGUF header and metadata",
    "tokenizer": "writing config.json and the tokenizer",
    "tensors": "dequantising tensors",
}


def _add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a .gguf file, or ollama:NAME[:TAG] from Ollama's store"
                                       " (`kvdeck models` lists what it finds)")  # fmt: skip
    parser.add_argument("--name", default=None,
                        help="name in kvdeck's store (default: the file's or the Ollama model's name)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="dtype of the dequantised weights (default: bfloat16)")  # fmt: skip


def run_import(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    bar = ImportBar(out)
    try:
        path, name, origin = resolve_source(args.source)
        name = args.name or name
        print(f"importing {args.source} as {name} ({args.dtype})", file=out)
        model = import_gguf(path, name, dtype=args.dtype, on_progress=bar, origin=origin)
    except (KeyboardInterrupt, ImportCancelled):
        bar.finish()
        print("kvdeck: interrupted; nothing was kept", file=sys.stderr)
        return 130
    except (GGUFImportError, OSError) as exc:
        bar.finish()
        print(f"kvdeck: error: {exc}", file=sys.stderr)
        return 1
    bar.finish()
    print(f"imported {model.name} ({model.architecture}, {format_params(model.num_params)} params,"
          f" {model.dtype}, {format_bytes(model.size_bytes)})", file=out)  # fmt: skip
    print(f"path: {model.path}", file=out)
    return 0


def print_importable(out: TextIO) -> None:
    """The GGUF models found in Ollama's and LM Studio's stores, as a table (nothing if none)."""
    found = find_importable()
    if not found:
        return
    print("\nimportable GGUF models (`kvdeck import REF`):", file=out)
    rows = [("REF", "ARCH", "QUANT", "SIZE", "SOURCE", "STATUS")]
    for item in found:
        rows.append((item.ref, item.architecture, item.quantization, format_bytes(item.size_bytes),
                     item.source, _status(item)))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)


def importable_json() -> list[dict]:
    return [{"ref": i.ref, "name": i.name, "source": i.source, "path": str(i.path),
             "architecture": i.architecture, "quantization": i.quantization,
             "size_bytes": i.size_bytes, "importable": i.problem is None, "problem": i.problem,
             "imported_as": i.imported_as} for i in find_importable()]  # fmt: skip


def _status(item: ImportableGGUF) -> str:
    if item.problem:
        return f"not importable: {item.problem}"
    if item.imported_as:
        return f"imported as {item.imported_as}"
    return "importable"


COMMANDS = {"import": (_add_import_arguments, run_import)}  # the help text is in kvdeck.app.cli
