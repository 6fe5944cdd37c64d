"""A `python` as the lent GPU image has it, for shell scripts meant to run there:

    PYTHON="python tests/bench/python_on_gpu_image.py" bash benchmarks/run_gpu.sh imports

kvdeck is importable only through sys.path (the GPU image has no install of it, so this
venv's editable-install finder is removed) and kvdeck's dependencies that the image lacks are
blocked. Takes `-m MODULE ARGS`, `-c CODE` or `SCRIPT ARGS`, each with the sys.path[0] that
python gives it: the working directory for -m and -c, the script's folder for a script.
"""

import os
import runpy
import sys

from gpu_image_imports import BlockAbsent  # beside this file


def _without_editable_finders(finders: list) -> list:
    return [f for f in finders if "__editable__" not in getattr(f, "__module__", "")]


def main() -> None:
    sys.meta_path[:] = [BlockAbsent(), *_without_editable_finders(sys.meta_path)]
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python_on_gpu_image.py -m MODULE ARGS | -c CODE | SCRIPT ARGS")
    if args[0] == "-m":
        sys.path[0] = os.getcwd()
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.path[0] = ""
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        script = os.path.abspath(args[0])
        sys.path[0] = os.path.dirname(script)
        sys.argv = args
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
