"""Regenerate calibration.txt: the docstrings of Python's standard library (PSF licence).

Run with the interpreter whose documentation you want: `python build_calibration.py`.
The output is deterministic for a given Python version. Documents (one module's
docstring, or one public function/class with its docstring) are separated by blank lines.
"""

import contextlib
import importlib
import inspect
import io
import sys
import warnings
from pathlib import Path

# Imports with side effects, GUI toolkits, and private/test modules.
SKIPPED = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
    "pydoc_data", "ensurepip", "venv", "__hello__", "__phello__", "msvcrt", "winreg",
    "winsound", "nt", "_tkinter",
}
MAX_CHARS = 500_000
MAX_DOC_CHARS = 3000
# Per-module budget, so the text covers the whole library rather than its first letters.
MAX_MODULE_CHARS = 3500


def documents() -> list[str]:
    docs = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIPPED:
            continue
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:
            continue
        module_docs = []
        doc = inspect.getdoc(module)
        if doc:
            module_docs.append(f"Module {name}.\n\n{doc[:MAX_DOC_CHARS]}")
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            if getattr(obj, "__module__", name) != name:
                continue
            text = inspect.getdoc(obj)
            if text and len(text) > 80:
                module_docs.append(f"{name}.{attr}: {text[:MAX_DOC_CHARS]}")
        used = 0
        for text in module_docs:
            if used + len(text) > MAX_MODULE_CHARS and used:
                break
            docs.append(text)
            used += len(text)
    return docs


def main() -> None:
    out, total = [], 0
    for doc in documents():
        if total + len(doc) > MAX_CHARS:
            break
        out.append(doc)
        total += len(doc) + 2
    target = Path(__file__).with_name("calibration.txt")
    tmp = target.with_suffix(".txt.tmp")
    tmp.write_text("\n\n".join(out) + "\n", encoding="utf-8")
    tmp.replace(target)
    print(f"wrote {target} ({total} characters, {len(out)} documents)")


if __name__ == "__main__":
    main()
