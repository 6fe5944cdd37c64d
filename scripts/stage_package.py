"""Lay out the `kvdeck` package from this checkout into a site directory, without pip or
setuptools: what a wheel install does for a pure-Python project, for machines that have
torch but no build tools and no network (the lent GPU image).

    python scripts/stage_package.py DIR && PYTHONPATH=DIR python -m kvdeck --help

The mapping of folders to packages is read from pyproject.toml, so it is defined once.
"""

import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage(target: Path) -> Path:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = config["package-dir"]
    root = target / "kvdeck"
    if root.exists():
        shutil.rmtree(root)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "screenshots")
    # Shortest names first: kvdeck itself, then its sub-packages inside it.
    for package in sorted(package_dir, key=len):
        destination = target.joinpath(*package.split("."))
        shutil.copytree(REPO / package_dir[package], destination, ignore=ignore)
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/stage_package.py SITE_DIR")
    print(stage(Path(sys.argv[1]).resolve()))
