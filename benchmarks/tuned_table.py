"""The per-architecture TUNED tables the tune scripts write (kernels/triton/*_tuned.py): a module
docstring, then `TUNED: dict[int, dict] = {SM version: entry}` as plain data."""

import pprint
from pathlib import Path


def read_tuned(path: Path) -> dict[int, dict]:
    """The table's TUNED (empty when the file does not exist yet)."""
    if not path.exists():
        return {}
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return dict(namespace["TUNED"])


def write_tuned(table: dict[int, dict], path: Path) -> None:
    """Rewrite the table, its docstring kept."""
    header = path.read_text().split("\nTUNED", 1)[0] if path.exists() else '"""Tuned configs."""\n'
    body = pprint.pformat(table, width=100, sort_dicts=True)
    path.write_text(f"{header}\nTUNED: dict[int, dict] = {body}\n")
