#!/usr/bin/env bash
# Create .venv and install kvdeck into it (idempotent; fast when already done).
# Torch: on a machine with an NVIDIA driver pip's default (CUDA) build is right; without
# one we ask for the CPU build (KVDECK_TORCH overrides the requirement either way).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
venv_python=.venv/bin/python
if ! "$venv_python" -c "import torch" 2>/dev/null; then
    if [ -n "${KVDECK_TORCH:-}" ]; then
        torch_spec="$KVDECK_TORCH"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        torch_spec="torch"
    else
        torch_spec="torch==2.13.0"
    fi
    echo "bootstrap: installing $torch_spec"
    "$venv_python" -m pip install -q "$torch_spec"
fi
stamp=".venv/.kvdeck-installed${extras:+-$extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing kvdeck${extras:+[$extras]}"
    "$venv_python" -m pip install -q -e ".${extras:+[$extras]}"
    if [ "$extras" = "test" ]; then
        # The AutoAWQ package is the reference for checkpoint compatibility; its pins are
        # older than the transformers we need, so it goes in without its dependencies.
        "$venv_python" -m pip install -q --no-deps "autoawq==0.2.9"
    fi
    touch "$stamp"
fi
# The Triton the GPU image runs (3.6; the venv's is torch's, 3.9): the ahead-of-time compile
# matrix builds sm_90 with it too (tests/kernels/test_compile_for_gpu.py), so a kernel that
# lowers with one and not the other, or spills or loops worse there, shows before a lease.
gpu_image_triton=3.6.0
if [ "$extras" = "test" ] && [ ! -d ".venv/gpu-image-triton/triton-$gpu_image_triton.dist-info" ]; then
    echo "bootstrap: installing triton $gpu_image_triton for the GPU image's compile matrix"
    rm -rf .venv/gpu-image-triton
    "$venv_python" -m pip install -q --no-deps --target .venv/gpu-image-triton "triton==$gpu_image_triton"
fi
