#!/usr/bin/env bash
# The GPU figures, in stages that each fit one 10-minute command of a lent H100/H200 (the
# device image has torch, triton and transformers; kvdeck's UI and server packages are not
# needed here). Run from anywhere:
#
#   benchmarks/run_gpu.sh check        # kernels vs torch on the GPU, CUDA graphs vs eager
#                                      # (the repacked W4A16 kernel at every decode batch size
#                                      # and its GEMV form, then engine decode)
#   benchmarks/run_gpu.sh throughput   # standard workload, Qwen3-0.6B dummy bf16 on graphs, then as
#                                      # AWQ INT4 (marlin), then bf16 without async scheduling, eager
#   benchmarks/run_gpu.sh baseline     # the same workload with --baseline hf (the 10x target)
#   benchmarks/run_gpu.sh decode       # batch-1 Llama-3.2-1B against the bandwidth roofline
#   benchmarks/run_gpu.sh kernels      # attention tile sweep (the kernels' check is in `check`)
#   benchmarks/run_gpu.sh w4a16        # the W4A16 GEMMs (AWQ layout, repacked `marlin`) and bf16/fp16
#                                      # cuBLAS inside CUDA graphs, then AWQ e2e decode with each,
#                                      # then the decode-size launch taken apart (w4a16_anatomy.py)
#   benchmarks/run_gpu.sh profile      # where a decode step's time goes, batch 1/8/64, graphs and eager,
#                                      # and batch 64 under 8 rank-16 adapters
#   benchmarks/run_gpu.sh lora         # the LoRA kernels' launch configs swept (lora_tune.py commits the
#                                      # pick), then decode at 64 requests under 8 rank-16 adapters vs
#                                      # the base alone, both on CUDA graphs (multi-LoRA's <= 1.2x target)
#   benchmarks/run_gpu.sh imports      # only that the staged package runs (no GPU needed; tested)
#   benchmarks/run_gpu.sh all          # check, w4a16, lora, throughput in one command, each under a
#                                      # time cap, the caps adding up to 480 s (benchmarks/gpu_battery.py;
#                                      # baseline, decode, kernels and profile need their own); on the
#                                      # device tool (OUT_DIR=$OUT, or BATTERY_ARCHIVE=1) everything
#                                      # lands in OUT_DIR/battery.tar.gz
#
# JSON goes to $2, else $OUT_DIR, else benchmarks/results, named after the GPU (h100, h200,
# ...); every stage writes its JSON as it goes, and `all` adds OUT_DIR/battery.json and a log
# per stage. REPEATS=1 asks for one timed run per throughput figure; PYTHON=... names the
# interpreter. KVDECK_BATTERY_SMOKE=DIR is the CPU test of this script (tests/bench/
# test_gpu_battery.py): every stage's commands on the tiny model in DIR, the kernels under the
# Triton interpreter, timings that need a GPU from a fake clock.
set -euo pipefail
stage=${1:?usage: benchmarks/run_gpu.sh check|throughput|baseline|decode|kernels|w4a16|profile|lora|imports|all [OUT_DIR]}
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${2:-${OUT_DIR:-benchmarks/results}}
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
kvdeck() { $python -m kvdeck "$@"; }
qwen=benchmarks/configs/qwen3-0.6b/config.json
llama1b=benchmarks/configs/llama-3.2-1b/config.json
# The standard workload (benchmarks/README.md, as nano-vllm's bench): 256 requests, input and output lengths in [100, 1024].
standard=(--num-prompts 256 --input-len 100:1024 --output-len 100:1024 --seed 0)
decode_len=(--input-len 128 --output-len 256)
repeats=${REPEATS:-3}
dummy=(--load-format dummy --dtype bfloat16)
profile=(--model "$qwen")
awq_group=128
smoke=()  # what each GPU script takes to run its CPU smoke form
if [ -n "${KVDECK_BATTERY_SMOKE:-}" ]; then
    qwen=$KVDECK_BATTERY_SMOKE
    llama1b=$KVDECK_BATTERY_SMOKE
    standard=(--num-prompts 4 --input-len 8:16 --output-len 4:8 --seed 0)
    decode_len=(--input-len 8 --output-len 6)
    dummy=(--load-format dummy --dtype float32 --device cpu --kv-cache-memory-gib 0.01)
    profile=(--model "$qwen" --load-format dummy --dtype float32 --kv-cache-memory-gib 0.01
             --input-len 4 --output-len 4)
    smoke=(--smoke --model "$KVDECK_BATTERY_SMOKE")
    awq_group=32  # the tiny model's 64-wide hidden state
    export TRITON_INTERPRET=1
fi
if [ "$stage" != imports ] && [ "$stage" != all ]; then
    gpu=$($python -c "import torch; print(torch.cuda.get_device_name(0).lower().replace('nvidia ', '').split()[0] if torch.cuda.is_available() else 'cpu')")
fi

case $stage in
  check)
    $python benchmarks/check_kernels_gpu.py "${smoke[@]:0:1}" --out "$out/check_kernels_$gpu.json"
    # The repacked W4A16 kernel (what `auto` serves AWQ/GPTQ layers with; the w4a16 stage's e2e
    # and throughput's AWQ run replay it) captured at every decode batch size, its GEMV form
    # too, before the engine's graphs: the 2026-11-29 lease's stage was cut before it ran.
    KVDECK_W4A16_KERNEL=marlin $python benchmarks/bench_w4a16.py --check-graphs "${smoke[@]:0:1}"
    $python benchmarks/check_cuda_graphs.py "${smoke[@]}" --out "$out/cuda_graphs_$gpu.json"
    ;;
  throughput)
    # CUDA graphs with async scheduling (the default); the same model as AWQ INT4 on the
    # repacked marlin kernel (INT4's target: not slower than its bf16 self); then bf16 without async
    # scheduling, then eager.
    kvdeck bench throughput "${dummy[@]}" --model "$qwen" "${standard[@]}" --repeats "$repeats" \
        --out "$out/throughput_qwen3-0.6b_$gpu.json"
    awq_dir=$(mktemp -d)
    $python benchmarks/awq_config.py "$qwen" "$awq_dir" --group-size "$awq_group" >/dev/null
    KVDECK_W4A16_KERNEL=marlin kvdeck bench throughput "${dummy[@]}" --model "$awq_dir" "${standard[@]}" \
        --repeats "$repeats" --out "$out/throughput_qwen3-0.6b_awq_marlin_$gpu.json"
    rm -rf "$awq_dir"
    kvdeck bench throughput "${dummy[@]}" --model "$qwen" "${standard[@]}" --repeats "$repeats" \
        --no-async-scheduling --out "$out/throughput_qwen3-0.6b_sync_$gpu.json"
    kvdeck bench throughput "${dummy[@]}" --model "$qwen" "${standard[@]}" --repeats "$repeats" \
        --enforce-eager --out "$out/throughput_qwen3-0.6b_eager_$gpu.json"
    ;;
  baseline)
    kvdeck bench throughput "${dummy[@]}" --model "$qwen" "${standard[@]}" --baseline hf \
        --out "$out/throughput_qwen3-0.6b_vs_hf_$gpu.json"
    ;;
  decode)
    kvdeck bench decode "${dummy[@]}" --model "$llama1b" "${decode_len[@]}" \
        --out "$out/decode_llama-3.2-1b_$gpu.json"
    kvdeck bench decode "${dummy[@]}" --model "$llama1b" "${decode_len[@]}" \
        --enforce-eager --out "$out/decode_llama-3.2-1b_eager_$gpu.json"
    ;;
  kernels)
    $python benchmarks/bench_kernels.py "${smoke[@]:0:1}" --no-check --sweep --out "$out/kernels_$gpu.json"
    ;;
  w4a16)
    # The table (every kernel beside bf16/fp16 cuBLAS, no per-row config sweep), then the
    # marlin config sweep the tuned table comes from (w4a16_tune.py), then e2e, then where a
    # decode-size launch's time goes (w4a16_anatomy.py; last, a diagnosis).
    $python benchmarks/bench_w4a16.py "${smoke[@]:0:1}" --cuda-graph --no-sweep --marlin-sweep --e2e \
        --anatomy --out "$out/w4a16_$gpu.json"
    ;;
  profile)
    $python benchmarks/profile_decode.py "${profile[@]}" --out "$out/profile_decode_qwen3-0.6b_$gpu.json"
    $python benchmarks/profile_decode.py "${profile[@]}" --enforce-eager --batch-sizes 1,8 \
        --out "$out/profile_decode_qwen3-0.6b_eager_$gpu.json"
    # Multi-LoRA's target shape: 64 requests under 8 rank-16 adapters, graphs (the LoRA kernels' share).
    $python benchmarks/profile_decode.py "${profile[@]}" --batch-sizes 64 --lora-adapters 8 --lora-rank 16 \
        --out "$out/profile_decode_qwen3-0.6b_lora_$gpu.json"
    ;;
  lora)
    # The kernels' launch configs swept under CUDA graphs (lora_tune.py commits the pick), then
    # the decode target with the engine serving the sweep's pick.
    # A sweep that fails still leaves the decode target to run, under the committed config.
    # --budget-s: the sweep leaves the stage's cap (gpu_battery.py: 90 s) ~45 s for the target.
    $python benchmarks/bench_lora_kernels.py "${smoke[@]:0:1}" --budget-s 40 --out "$out/lora_kernels_$gpu.json" \
        || echo "lora: the kernel sweep failed (exit $?); the target runs under the committed config" >&2
    $python benchmarks/bench_lora_gpu.py "${smoke[@]}" --config-from "$out/lora_kernels_$gpu.json" \
        --out "$out/lora_gpu_$gpu.json"
    ;;
  all)
    fake=()
    [ -n "${KVDECK_BATTERY_SMOKE:-}" ] && fake=(--fake-clock)
    # The device tool brings back at most 8 files from its $OUT and the battery writes more: with
    # BATTERY_ARCHIVE=1, or when OUT_DIR is that $OUT, the stages write into a scratch folder and
    # OUT_DIR gets one battery.tar.gz of them all, rewritten after every stage.
    work=$out archive=()
    if [ "${BATTERY_ARCHIVE:-0}" = 1 ] || { [ -n "${OUT:-}" ] && [ "$(cd "$OUT" 2>/dev/null && pwd)" = "$out" ]; }; then
        work=$(mktemp -d) archive=(--archive "$out/battery.tar.gz")
        echo "battery: the stages write into $work, packed into $out/battery.tar.gz after each"
    fi
    $python benchmarks/gpu_battery.py --script "$repo/benchmarks/run_gpu.sh" --out-dir "$work" "${archive[@]}" \
        "${fake[@]}"
    ;;
  imports)
    kvdeck --help >/dev/null
    $python -c "import kvdeck.engine.api.llm, kvdeck.kernels.reference.attention, kvdeck.quant.awq_linear"
    for script in bench_w4a16 w4a16_e2e w4a16_tune profile_decode check_cuda_graphs bench_lora_gpu gpu_battery \
                  awq_config bench_lora_kernels lora_tune; do
        $python benchmarks/$script.py --help >/dev/null
    done
    echo "imports: the staged package runs"
    ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
