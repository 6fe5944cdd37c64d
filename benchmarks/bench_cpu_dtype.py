"""Which dtype the CPU should run a model in: fp32 against bf16, batch-1 decode and batched
throughput, each run in its own process (a model that ran in a process slows the next one
there), the two sides alternating, every pair's ratio kept; plus greedy agreement of bf16
with fp32 over chat prompts (is bf16 still correct for this model?).

    python benchmarks/bench_cpu_dtype.py --out benchmarks/results/cpu_dtype_smollm2.json

Default model: SmolLM2-135M-Instruct (kvdeck's default; fetched on first use).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")
PROMPTS = ["What is the capital of France?", "Name three colours.",
           "Write one sentence about the sea.", "What is 12 plus 7?"]


def bench(kind: str, model: str, dtype: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "kvdeck.app.cli", "bench", kind, "--model", model,
                   "--dtype", dtype, "--device", "cpu", "--out", str(out)]
        if kind == "decode":
            command += ["--input-len", "128", "--output-len", str(args.output_len),
                        "--repeats", "3"]
        else:
            command += ["--num-prompts", str(args.num_prompts), "--input-len", "128:128",
                        "--output-len", f"{args.output_len}:{args.output_len}"]
        subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def tokens_per_s(kind: str, result: dict) -> float:
    if kind == "decode":
        return 1.0 / result["decode"]["time_per_output_token_s"]
    return result["kvdeck"]["output_tokens_per_s"]


def greedy_agreement(model: str, max_tokens: int) -> dict:
    """bf16 greedy tokens against fp32's, prompt by prompt: the shared prefix length."""
    from kvdeck import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = {}
    for dtype in DTYPES:
        with LLM(model=model, dtype=dtype, device="cpu") as llm:
            replies = [llm.chat([{"role": "user", "content": p}], params)[0] for p in PROMPTS]
            outputs[dtype] = [r.outputs[0].token_ids for r in replies]
            outputs[dtype + "_text"] = [r.outputs[0].text for r in replies]
    agree = []
    for a, b in zip(outputs["float32"], outputs["bfloat16"]):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree.append(same)
    return {"prompts": PROMPTS, "max_tokens": max_tokens, "tokens_equal_before_divergence": agree,
            "float32_text": outputs["float32_text"], "bfloat16_text": outputs["bfloat16_text"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.app.cli.default_model import default_model

    model = args.model or default_model(None)
    if model is None:
        raise SystemExit("SmolLM2-135M-Instruct could not be fetched; pass --model")
    results: dict = {}
    for kind in ("decode", "throughput"):
        pairs = []
        for round_index in range(args.rounds):
            order = DTYPES if round_index % 2 == 0 else DTYPES[::-1]  # alternate who goes first
            speed = {dtype: tokens_per_s(kind, bench(kind, model, dtype, args)) for dtype in order}
            pairs.append({**speed, "bf16_over_fp32": speed["bfloat16"] / speed["float32"]})
            print(f"{kind} round {round_index + 1}: fp32 {speed['float32']:.1f} tok/s, "
                  f"bf16 {speed['bfloat16']:.1f} tok/s", flush=True)
        results[kind] = {"pairs": pairs, "median_bf16_over_fp32": statistics.median(
            p["bf16_over_fp32"] for p in pairs),
            "median_tok_s": {d: statistics.median(p[d] for p in pairs) for d in DTYPES}}
    results["greedy"] = greedy_agreement(model, 64)
    print(json.dumps({k: v for k, v in results.items() if k != "greedy"}, indent=1))
    print("greedy agreement (tokens equal before divergence):",
          results["greedy"]["tokens_equal_before_divergence"])
    if args.out:
        config = {"model": Path(model).name, "rounds": args.rounds, "output_len": args.output_len,
                  "num_prompts": args.num_prompts, "device": "cpu"}
        write_json_atomic(Path(args.out), build_result("cpu_dtype", config, results))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
