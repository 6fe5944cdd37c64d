#!/usr/bin/env bash
# The CPU figures committed in benchmarks/results/ (demo model, float32): kvdeck against
# Hugging Face generate on the same requests in the same run, KV waste at peak, and a
# serving run with Poisson arrivals, and batch-1 decode against the bandwidth roofline. Run
# on an otherwise idle machine; --repeats 5 reports the median run of each side, since a
# shared 2-core VM varies by +-15% from run to run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
kvdeck=.venv/bin/kvdeck
python=.venv/bin/python
out=benchmarks/results
$kvdeck bench throughput --num-prompts 32 --input-len 16:256 --output-len 16:128 --baseline hf --repeats 5 \
    --out $out/cpu_throughput_demo_32.json --plot $out/cpu_throughput_demo_32.png
$kvdeck bench throughput --num-prompts 64 --input-len 16:256 --output-len 16:256 --baseline hf --repeats 5 \
    --out $out/cpu_throughput_demo_64.json
$python benchmarks/bench_serving.py --request-rate 4 --num-prompts 120 --input-len 16:256 \
    --output-len 16:128 --seed 0 --out $out/serving_demo_cpu_rate4.json \
    --plot $out/serving_demo_cpu_rate4.png
$kvdeck bench decode --input-len 128 --output-len 256 --repeats 5 --out $out/cpu_decode_demo.json
$kvdeck bench decode --load-format dummy --model benchmarks/configs/llama-3.2-1b/config.json \
    --input-len 128 --output-len 32 --repeats 3 --kv-cache-memory-gib 0.5 \
    --out $out/cpu_decode_llama-3.2-1b.json
