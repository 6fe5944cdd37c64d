"""An INT4 model on the CPU, scored through the engine: held-out perplexity of the native path
(the INT4 kernel with int8 activations, the int8 output head, in the dtype the engine picks)
against the reference path (AutoAWQ's weights dequantised, fp32 matmuls, the dense head),
and the dense model it was quantised from.

    python benchmarks/quality_int4_cpu.py --model INT4_DIR --dense DENSE_DIR \
        --out benchmarks/results/quality_int4_cpu_smollm2.json

Perplexity: exp(mean next-token NLL) over non-overlapping windows of --seq-len tokens of
--file (Debian's GPL-3 text by default: neither model nor quantiser saw it), each window one
prefill through the paged cache (engine/runner/scoring.py).
"""

import argparse
import os
from pathlib import Path

import torch

from kvdeck import LLM
from kvdeck.app.bench.result import build_result, write_json_atomic
from kvdeck.engine.runner.scoring import sequence_logits

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


def perplexity(llm: LLM, ids: list[int], seq_len: int, max_windows: int) -> tuple[float, int]:
    runner = llm.engine.core.runner
    total, count = 0.0, 0
    for start in list(range(0, len(ids) - 1, seq_len))[:max_windows]:
        window = ids[start:start + seq_len]
        if len(window) < 2:
            break
        logits = sequence_logits(runner, window)[:-1]
        target = torch.tensor(window[1:])
        total += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        count += len(window) - 1
    return float(torch.tensor(total / count).exp()), count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the INT4 (AWQ layout) model folder")
    parser.add_argument("--dense", default=None, help="the dense model it was quantised from")
    parser.add_argument("--file", default=str(DEFAULT_TEXT))
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-windows", type=int, default=16)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    paths = {  # name: (model, engine options)
        "int4_native": (args.model, {}),
        "int4_native_fp32": (args.model, {"dtype": "float32"}),
        "int4_reference_fp32": (args.model, {"dtype": "float32", "attention_backend": "torch"}),
    }
    if args.dense:
        paths["dense"] = (args.dense, {})
    figures: dict[str, dict] = {}
    for name, (model, options) in paths.items():
        llm = LLM(model, device="cpu", kv_cache_memory_gib=0.25, **options)
        runner = llm.engine.core.runner
        text = Path(args.file).read_text(encoding="utf-8")
        ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
        ppl, scored = perplexity(llm, ids, args.seq_len, args.max_windows)
        head = type(runner.model.lm_head).__name__
        dtype = str(runner.dtype).split(".")[-1]
        figures[name] = {"perplexity": ppl, "scored_tokens": scored, "dtype": dtype, "options": options,
                         "output_head": head}
        print(f"{name:>20}: ppl {ppl:8.4f} over {scored} tokens ({figures[name]['dtype']}, head {head})",
              flush=True)
        llm.shutdown()
    native, reference = figures["int4_native"]["perplexity"], figures["int4_reference_fp32"]["perplexity"]
    figures["native_vs_reference"] = native / reference - 1
    print(f"native vs reference: {100 * figures['native_vs_reference']:+.2f}%")
    if args.out:
        config = {"model": args.model, "dense": args.dense, "file": args.file, "seq_len": args.seq_len,
                  "max_windows": args.max_windows, "threads": torch.get_num_threads(),
                  "load_average_before_after": [load_before, os.getloadavg()]}
        write_json_atomic(Path(args.out), build_result("quality_int4_cpu", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
