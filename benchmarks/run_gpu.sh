#!/usr/bin/env bash
# The GPU figures of the benchmark issue, in stages that each fit one 10-minute command of
# a lent H100/H200 (the device image has torch, triton and transformers; kvdeck's UI and
# server packages are not needed here). Run from anywhere:
#
#   benchmarks/run_gpu.sh check        # kernels vs torch on the GPU, CUDA graphs vs eager
#                                      # (engine decode, and W4A16 at every decode batch size)
#   benchmarks/run_gpu.sh throughput   # standard workload, Qwen3-0.6B dummy bf16, graphs and eager
#   benchmarks/run_gpu.sh baseline     # the same workload with --baseline hf (the 10x target)
#   benchmarks/run_gpu.sh decode       # batch-1 Llama-3.2-1B against the bandwidth roofline
#   benchmarks/run_gpu.sh kernels      # attention tile sweep and the W4A16 GEMM (AWQ e2e)
#   benchmarks/run_gpu.sh imports      # only that the staged package runs (no GPU needed; tested)
#   benchmarks/run_gpu.sh profile      # where a decode step's time goes, batch 1/8/64, graphs and eager
#   benchmarks/run_gpu.sh all          # profile, decode, check, throughput, kernels in one 10-minute
#                                      # command, each under a time cap, one timed run each: a
#                                      # 15-minute lease (logs in OUT_DIR; baseline needs its own)
#
# REPEATS=1 asks for one timed run per throughput figure (a short lease).
# JSON goes to $2 (default benchmarks/results), named after the GPU (h100, h200, ...).
set -euo pipefail
stage=${1:?usage: benchmarks/run_gpu.sh check|throughput|baseline|decode|kernels|profile|imports|all [OUT_DIR]}
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${2:-benchmarks/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
case $python in
    */*) [[ $python == /* ]] || python=$repo/$python ;;  # a relative path: the runs cd below
esac
export PYTHONUNBUFFERED=1
# The GPU image has torch, triton and transformers but no kvdeck and no build tools: lay the
# package out from this checkout (as a wheel install would), put the benchmarks beside it and
# run from there. In the checkout itself the root's kvdeck/ folder (only the namespace's
# __init__) would shadow the laid-out package: `python -m` and the scripts put it first on
# sys.path.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
$python scripts/stage_package.py "$site" >/dev/null
cp -r benchmarks "$site/"
cd "$site"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
# Triton 3.9 warns when this is unset and 3.10 changes its default to off; 1 keeps the fused
# multiply-adds every figure so far was measured with (triton 3.6's default).
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
if [ "$stage" != imports ] && [ "$stage" != all ]; then
    gpu=$($python -c "import torch; print(torch.cuda.get_device_name(0).lower().replace('nvidia ', '').split()[0])")
fi
kvdeck() { $python -m kvdeck "$@"; }
qwen=benchmarks/configs/qwen3-0.6b/config.json
llama1b=benchmarks/configs/llama-3.2-1b/config.json
# The standard workload (benchmarks/README.md, as nano-vllm's bench): 256 requests, input and output lengths in [100, 1024].
standard=(--num-prompts 256 --input-len 100:1024 --output-len 100:1024 --seed 0)
repeats=${REPEATS:-3}
dummy=(--load-format dummy --dtype bfloat16)

case $stage in
  check)
    $python benchmarks/check_kernels_gpu.py
    $python benchmarks/check_cuda_graphs.py --out "$out/cuda_graphs_$gpu.json"
    $python benchmarks/bench_w4a16.py --check-graphs
    ;;
  throughput)
    kvdeck bench throughput "${dummy[@]}" --model $qwen "${standard[@]}" --repeats "$repeats" \
        --out "$out/throughput_qwen3-0.6b_$gpu.json" --plot "$out/throughput_qwen3-0.6b_$gpu.png"
    kvdeck bench throughput "${dummy[@]}" --model $qwen "${standard[@]}" --repeats "$repeats" \
        --enforce-eager --out "$out/throughput_qwen3-0.6b_eager_$gpu.json"
    ;;
  baseline)
    kvdeck bench throughput "${dummy[@]}" --model $qwen "${standard[@]}" --baseline hf \
        --out "$out/throughput_qwen3-0.6b_vs_hf_$gpu.json"
    ;;
  decode)
    kvdeck bench decode "${dummy[@]}" --model $llama1b --input-len 128 --output-len 256 \
        --out "$out/decode_llama-3.2-1b_$gpu.json"
    kvdeck bench decode "${dummy[@]}" --model $llama1b --input-len 128 --output-len 256 \
        --enforce-eager --out "$out/decode_llama-3.2-1b_eager_$gpu.json"
    ;;
  kernels)
    $python benchmarks/bench_kernels.py --sweep --out "$out/kernels_$gpu.json"
    $python benchmarks/bench_w4a16.py --e2e --out "$out/w4a16_$gpu.json"
    ;;
  all)
    # Caps in seconds (the first H100 lease: check took 140+, throughput 88, decode 80); the
    # order puts first what that lease left open.
    for entry in profile:110 decode:100 check:150 throughput:110 kernels:100; do
        name=${entry%%:*}
        started=$SECONDS
        status=0
        REPEATS=1 timeout -k 5 "${entry#*:}" bash "$repo/benchmarks/run_gpu.sh" "$name" "$out" \
            >"$out/$name.log" 2>&1 || status=$?
        echo "stage $name: exit $status after $((SECONDS - started)) s (124: cut off at its cap)"
    done
    ;;
  profile)
    $python benchmarks/profile_decode.py --out "$out/profile_decode_qwen3-0.6b_$gpu.json"
    $python benchmarks/profile_decode.py --enforce-eager --batch-sizes 1,8 \
        --out "$out/profile_decode_qwen3-0.6b_eager_$gpu.json"
    ;;
  imports)
    kvdeck --help >/dev/null
    $python -c "import kvdeck.engine.api.llm, kvdeck.kernels.reference.attention, kvdeck.quant.awq_linear"
    $python benchmarks/bench_w4a16.py --help >/dev/null
    $python benchmarks/profile_decode.py --help >/dev/null
    echo "imports: the staged package runs"
    ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
