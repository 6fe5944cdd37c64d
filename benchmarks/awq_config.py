"""An AWQ INT4 model of a given shape for `--load-format dummy` runs: writes OUT_DIR/config.json,
SRC's config with AutoAWQ's quantisation_config added (4 bits, zero points, GEMM layout), so the
engine builds its INT4 layers with random packed weights. run_gpu.sh's throughput stage times
the standard workload on Qwen3-0.6B this way against its bf16 self (INT4 must not be slower).

    python benchmarks/awq_config.py SRC OUT_DIR [--group-size 128]

SRC is a model folder or its config.json; only the config is read (no weights, no tokenizer).
"""

import argparse
import json
import sys
from pathlib import Path

from kvdeck.quant.checkpoint import AWQ_QUANTIZATION_CONFIG


def awq_config(source: dict, group_size: int) -> dict:
    """SRC's config with AWQ INT4 quantisation; a clear error where a layer's input width is
    not a multiple of the group (the engine's loader would refuse it later, less plainly)."""
    widths = {"hidden_size": source.get("hidden_size"), "intermediate_size": source.get("intermediate_size")}
    for name, width in widths.items():
        if not isinstance(width, int) or width % group_size:
            raise ValueError(f"{name} {width!r} is not a multiple of the AWQ group size {group_size}")
    return {**source, "quantization_config": {**AWQ_QUANTIZATION_CONFIG, "group_size": group_size}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a model folder or its config.json")
    parser.add_argument("out_dir", type=Path, help="the folder to write config.json into")
    parser.add_argument("--group-size", type=int, default=AWQ_QUANTIZATION_CONFIG["group_size"],
                        choices=(32, 64, 128))
    args = parser.parse_args(argv)
    config_path = args.source / "config.json" if args.source.is_dir() else args.source
    try:
        config = awq_config(json.loads(config_path.read_text()), args.group_size)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"awq_config: {config_path}: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
