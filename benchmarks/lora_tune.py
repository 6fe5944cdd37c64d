"""The LoRA kernel sweep's JSON -> the per-architecture pick in kernels/triton/lora_tuned.py.

    python benchmarks/lora_tune.py benchmarks/results/lora_kernels_h200.json            # write it
    python benchmarks/lora_tune.py benchmarks/results/lora_kernels_h200.json --dry-run  # print only

The JSON is bench_lora_kernels.py's (what `benchmarks/run_gpu.sh lora` runs first); commit it
beside the table this writes. The pick is the candidate whose step of LoRA linears (every
layer's base GEMMs and deltas, in one CUDA graph) cost least; rows the sweep could not run
or check (`error`) or did not reach (`skipped`) are left out. A smoke run (`--smoke`, fake
timings) is refused.
"""

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuned_table import read_tuned, write_tuned  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "kernels" / "triton" / "lora_tuned.py"


def pick(sweep: dict) -> tuple[int, dict]:
    """(SM version, its TUNED entry) from a sweep."""
    from kvdeck.kernels.triton.lora_plan import parse_config

    config = sweep["config"]
    if config.get("smoke"):
        raise ValueError("a smoke sweep has no timings to tune from")
    if config.get("arch") is None:
        raise ValueError("the sweep names no GPU architecture (it ran off CUDA)")
    timed = [row for row in sweep["rows"] if "step_ms" in row]
    if not timed:
        raise ValueError("the sweep timed no candidate")
    best = min(timed, key=lambda row: row["step_ms"])
    chosen = parse_config(best["config"])
    device = sweep["environment"].get("device")
    entry = {"config": {field.name: getattr(chosen, field.name) for field in fields(chosen)},
             "step_ms": round(best["step_ms"], 4),
             "source": f"{sweep.get('command', 'bench_lora_kernels.py')} on {device}"}
    return int(config["arch"]), entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    try:
        arch, entry = pick(json.loads(args.sweep.read_text()))
    except (ValueError, KeyError) as exc:
        print(f"lora_tune: {args.sweep}: {exc}", file=sys.stderr)
        return 1
    print(f"sm_{arch}: {entry}")
    if not args.dry_run:
        write_tuned({**read_tuned(args.table), arch: entry}, args.table)
        print(f"wrote {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
