"""Batch-1 decode under CPU contention: kvdeck's thread settings (count, OpenMP spin
policy), and llama.cpp with the same thread counts, with and without another process
keeping one core busy; all configurations in turns, in rounds, each in a fresh process.

    python benchmarks/bench_cpu_threads.py --rounds 3 --out benchmarks/results/cpu_threads_demo.json \\
        [--llama-cpp-gguf demo-f32.gguf]

On a shared 2-core machine a 2-thread torch pool whose threads spin-wait for each other
can stall a step by tens of milliseconds when a core is taken; this measures by how much,
per setting. Figures: the median time per output token over the rounds, and its spread.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# One decode in a fresh process (the OpenMP runtime reads its settings at start-up).
KVDECK_CHILD = """
import json, random, sys, time, torch
threads, model, input_len, output_len, extra = json.loads(sys.argv[1])
torch.set_num_threads(threads)
from kvdeck import LLM, SamplingParams
llm = LLM(model, max_num_seqs=1, max_model_len=input_len + output_len, kv_cache_memory_gib=0.05, **extra)
rng = random.Random(0)
prompt = [rng.randrange(llm.engine.info.vocab_size) for _ in range(input_len)]
params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False))
(out,) = llm.generate([prompt], params)
m = out.metrics
print(json.dumps((m.last_token_time - m.first_token_time) / (output_len - 1)))
"""

BUSY_LOOP = "while True: pass"


def kvdeck_tpot(threads: int, wait_policy: str | None, args) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    extra = json.loads(args.engine_json)
    payload = json.dumps([threads, args.model, args.input_len, args.output_len, extra])
    out = subprocess.run([sys.executable, "-c", KVDECK_CHILD, payload], env=env, capture_output=True,
                         text=True, timeout=1200, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def llama_cpp_tpot(threads: int, poll: str | None, args) -> float:
    from kvdeck.app.bench.llama_cpp import LlamaServer, complete, find_bin_dir

    prompt = list(range(3, 3 + args.input_len))
    extra = ["--poll", poll] if poll is not None else []
    with LlamaServer(find_bin_dir(args.llama_cpp_bin), Path(args.llama_cpp_gguf), threads,
                     args.input_len + args.output_len, kv_type=args.llama_cpp_kv_type,
                     extra_args=extra) as server:
        complete(server.url, prompt, 8)
        return complete(server.url, prompt, args.output_len).time_per_output_token_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: the demo model)")
    parser.add_argument("--engine-json", default="{}",
                        help='engine options, e.g. \'{"quantization": "int8"}\'')
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-cpp-gguf", default=None)
    parser.add_argument("--llama-cpp-bin", default=None)
    parser.add_argument("--llama-cpp-kv-type", default="f32", help="as kvdeck's fp32 KV cache")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    configs = [("kvdeck", threads, policy) for threads in (1, 2) for policy in (None, "PASSIVE")]
    if args.llama_cpp_gguf:
        # llama.cpp's own spin knob: --poll 0..100 (how long its threads busy-wait; default 50).
        configs += [("llama.cpp", 1, None), ("llama.cpp", 2, None), ("llama.cpp", 2, "0")]
    runs: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for busy in (False, True):
            competitor = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
            try:
                time.sleep(0.5 if busy else 0)
                for side, threads, policy in configs:
                    knob = "wait" if side == "kvdeck" else "poll"
                    key = f"{side} threads={threads} {knob}={policy or 'default'} busy_core={busy}"
                    tpot = (kvdeck_tpot(threads, policy, args) if side == "kvdeck"
                            else llama_cpp_tpot(threads, policy, args))
                    runs.setdefault(key, []).append(tpot)
                    print(f"round {round_index}: {key}: {tpot * 1e3:.2f} ms/token", flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
    summary = {key: {"median_ms": statistics.median(v) * 1e3, "min_ms": min(v) * 1e3,
                     "max_ms": max(v) * 1e3, "runs_ms": [x * 1e3 for x in v]} for key, v in runs.items()}
    for key, s in summary.items():
        print(f"{key:55s} median {s['median_ms']:8.2f} ms/token  ({s['min_ms']:.2f}-{s['max_ms']:.2f})")
    if args.out:
        from kvdeck.app.bench.result import build_result, write_json_atomic

        load = os.getloadavg()
        config = {key: value for key, value in vars(args).items() if key != "out"}
        config["load_average_at_end"] = load
        write_json_atomic(Path(args.out), build_result("cpu_threads", config, {"decode": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
