"""Benchmark results as JSON: the figures plus what is needed to trust them, the machine's
load average at the start and at the end among them (a figure taken while something else
ran is no figure: this 2-core machine's timings swing 2x under load)."""

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The load average when a benchmark started: this module is imported as it starts.
_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None


def environment() -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": "cpu",
        "load_average_start": _LOAD_AT_START,
        "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "kvdeck_env": kvdeck_knobs(),
    }
    for name in ("triton", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def kvdeck_knobs() -> dict[str, str]:
    """The KVDECK_* variables set (KVDECK_W4A16_KERNEL, KVDECK_CPU_ISA, ...): a run's kernels
    depend on them. Never a secret: KVDECK_API_KEY and the like are left out of a JSON that
    gets committed."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith("KVDECK_") and not any(word in name for word in _SECRET_WORDS)}


_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parents[2],  # the checkout, when run from one
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def build_result(kind: str, config: dict, figures: dict, argv: list[str] | None = None) -> dict:
    """`argv`: the arguments `kvdeck` was given, when a CLI command runs the benchmark (it
    may be called in-process, where sys.argv is the caller's); else sys.argv is the record."""
    return {
        "benchmark": kind,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command_line(["kvdeck", *argv]) if argv is not None else _command_line(),
        "commit": git_commit(),
        "environment": environment(),
        "config": config,
        **figures,
    }


def write_json_atomic(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def percentiles(values: list[float]) -> dict[str, float]:
    """mean, p50, p90, p99 (nearest-rank on the sorted values), as vLLM's bench reports."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        # Linear interpolation between closest ranks (numpy's default).
        pos = (len(ordered) - 1) * q
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {
        "mean": sum(ordered) / len(ordered),
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
    }


def _command_line() -> str:
    """The script that drove this run (kvdeck's own commands pass build_result their argv)."""
    return command_line(["python", *sys.argv])


def command_line(words: list[str]) -> str:
    """The command as a shell would take it, with the value of any secret option (`--api-key
    KEY`, `--token=...`) replaced: the JSON gets committed."""
    shown = []
    hide_next = False
    for word in words:
        if hide_next:
            shown.append("REDACTED")
            hide_next = False
            continue
        option, equals, _ = word.partition("=")
        secret = option.startswith("-") and bool(
            _SECRET_OPTION_WORDS & set(re.split(r"[-_]+", option.lower())))  # not --max-tokens
        if secret and equals:
            word = f"{option}=REDACTED"
        hide_next = secret and not equals
        shown.append(word)
    return shlex.join(shown)


_SECRET_OPTION_WORDS = {word.lower() for word in _SECRET_WORDS}
