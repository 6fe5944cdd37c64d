"""What `kvdeck --serve` adds per token above the engine's own step at batch 1: the server's
TPOT (one request at a time, streamed: IPC, detokenising, SSE framing) against the same
decode run in-process by `kvdeck bench decode`, in turns, in rounds; each round's
difference is in the JSON, the median is the figure.

    python benchmarks/bench_serving_overhead.py --out benchmarks/results/serving_overhead_demo.json

Same model, prompt length and output length on both sides (--model, --input-len,
--output-len); the server is started once, with the engine's default settings.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.serve_process import kvdeck_server  # noqa: E402
from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402

KVDECK = [sys.executable, "-m", "kvdeck.app.cli"]


def run_json(command: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([*command, "--out", str(out)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=8, help="requests per server round")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    decode = [*KVDECK, "bench", "decode", "--model", args.model, "--input-len",
              str(args.input_len), "--output-len", str(args.output_len), "--repeats", "3"]
    rounds = []
    with kvdeck_server(args.model) as url:
        serve = [*KVDECK, "bench", "serve", "--base-url", url, "--max-concurrency", "1",
                 "--num-prompts", str(args.num_prompts),
                 "--input-len", f"{args.input_len}:{args.input_len}",
                 "--output-len", f"{args.output_len}:{args.output_len}"]
        run_json(serve)  # warm-up
        for i in range(args.rounds):
            sides = {}
            for side in (("serve", "decode") if i % 2 == 0 else ("decode", "serve")):
                result = run_json(serve if side == "serve" else decode)
                sides[side] = (result["tpot_ms"]["p50"] if side == "serve"
                               else result["decode"]["time_per_output_token_s"] * 1e3)
            overhead = sides["serve"] - sides["decode"]
            rounds.append({"server_tpot_p50_ms": sides["serve"],
                           "engine_ms_per_token": sides["decode"], "overhead_ms": overhead})
            print(f"round {i}: server TPOT p50 {sides['serve']:.2f} ms, engine "
                  f"{sides['decode']:.2f} ms/token, overhead {overhead:.2f} ms/token")
    overheads = [r["overhead_ms"] for r in rounds]
    figures = {"overhead_ms_median": statistics.median(overheads), "overheads_ms": overheads,
               "rounds": rounds, "load_average": os.getloadavg()}
    print(f"median server overhead above the engine step: {figures['overhead_ms_median']:.2f} ms/token")
    if args.out:
        config = {k: getattr(args, k) for k in ("model", "rounds", "num_prompts", "input_len",
                                                 "output_len")}
        write_json_atomic(args.out, build_result("serving_overhead", config, figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
