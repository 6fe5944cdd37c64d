"""`kvdeck quantize SOURCE`: INT4 (AWQ or RTN) into kvdeck's model store, unless --out says where.

Writing into the store (through a staging folder, renamed when complete, registered with
the model it came from) is what lets the TUI's Models screen list, compare, load and
delete the result. SOURCE is a listed model's name or any model directory. The store's
modules are imported only when they are needed, so `--out` runs where only the quantiser's
dependencies are installed.
"""

import argparse
import shutil
import sys
from pathlib import Path

from kvdeck.quant.cli import add_quantize_arguments, run_quantize


def run_quantize_command(args: argparse.Namespace) -> int:
    if args.out is not None:
        return run_quantize(args)
    from kvdeck.app.jobs.quantize import default_name, install_quantized, new_staging
    from kvdeck.app.store import local_models

    source = local_models.find_model(args.source)
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


COMMANDS = {  # name: (add_arguments, run); the help texts are in kvdeck.app.cli
    "quantize": (add_quantize_arguments, run_quantize_command),
}
