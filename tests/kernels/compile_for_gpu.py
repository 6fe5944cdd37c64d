"""Compile every Triton kernel for a CUDA target ahead of time, without a GPU.

`python tests/kernels/compile_for_gpu.py [--arch 90] [--ptxas-info]` builds the kernels the
way the wrappers specialise them (dtypes, padded head dims, GQA groups, split counts) down
to a cubin with Triton's bundled ptxas, so code that only the interpreter ran is proven to
lower for real GPUs (e.g. loop-carried types, dot shapes). Prints one JSON line per variant.
Must run without TRITON_INTERPRET (the interpreter replaces `triton.jit`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kvdeck.kernels import (  # noqa: E402
    activation_triton,
    attention_triton,
    attention_tuning,
    kv_cache_triton,
    rmsnorm_triton,
    rope_triton,
)
from kvdeck.kernels.elementwise_tiling import num_warps_for, rows_per_program  # noqa: E402


def gpu_rows(row_elements: int) -> int:
    return rows_per_program(1 << 20, row_elements, torch.device("cuda"))


def attention_variant(dtype: str, head_dim: int, group: int, prefill: bool, segments: int):
    config = attention_tuning.default_config(16 if prefill else 1, head_dim, torch.device("cuda"))
    block_m = max(config.block_m, triton.next_power_of_2(group))
    f32 = dtype == "fp32"
    return (
        attention_triton._paged_attention_kernel,
        dict(out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_cache_ptr=f"*{dtype}",
             v_cache_ptr=f"*{dtype}", block_tables_ptr="*i32", query_start_loc_ptr="*i32",
             seq_lens_ptr="*i32", part_out_ptr="*fp32", part_max_ptr="*fp32",
             part_sum_ptr="*fp32", qk_scale="fp32"),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
             BLOCK_SIZE=16, GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_m // group,
             TILE_N=config.tile_n, NUM_SEGMENTS=segments, COMPUTE_F32=f32,
             DOT_PRECISION="ieee" if f32 else "tf32"),
        dict(num_warps=config.num_warps, num_stages=config.num_stages),
    )


VARIANTS = {
    "attention_prefill_bf16_d128_g4": attention_variant("bf16", 128, 4, True, 1),
    "attention_prefill_fp16_d80_g1": attention_variant("fp16", 80, 1, True, 1),
    "attention_prefill_bf16_d64_g8": attention_variant("bf16", 64, 8, True, 1),
    "attention_decode_bf16_d64_g4": attention_variant("bf16", 64, 4, False, 1),
    "attention_decode_split_fp16_d96_g8": attention_variant("fp16", 96, 8, False, 8),
    "attention_decode_fp32_d128_g7": attention_variant("fp32", 128, 7, False, 1),
    "merge_segments_bf16_d80": (
        attention_triton._merge_segments_kernel,
        dict(out_ptr="*bf16", part_out_ptr="*fp32", part_max_ptr="*fp32",
             part_sum_ptr="*fp32"),
        dict(HEAD_DIM=80, HEAD_DIM_PAD=128, NUM_SEGMENTS=8), dict(num_warps=4),
    ),
    "write_kv_cache_bf16": (
        kv_cache_triton._write_kv_cache_kernel,
        dict(key_ptr="*bf16", value_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
             slot_mapping_ptr="*i64"),
        dict(HEAD_DIM=128, HEADS_PAD=8, HEAD_DIM_PAD=128, BLOCK_SIZE=16,
             ROWS=gpu_rows(8 * 128)), dict(num_warps=num_warps_for(gpu_rows(8 * 128) * 8 * 128)),
    ),
    "rms_norm_residual_bf16_4096": (
        rmsnorm_triton._rms_norm_kernel,
        dict(x_ptr="*bf16", residual_ptr="*bf16", weight_ptr="*bf16", out_ptr="*bf16",
             residual_out_ptr="*bf16", eps="fp32"),
        dict(HAS_RESIDUAL=True, ROWS=gpu_rows(4096), BLOCK=4096),
        dict(num_warps=num_warps_for(gpu_rows(4096) * 4096)),
    ),
    "rms_norm_per_head_fp16_fp32weight_128": (
        rmsnorm_triton._rms_norm_kernel,
        dict(x_ptr="*fp16", residual_ptr="*fp16", weight_ptr="*fp32", out_ptr="*fp32",
             residual_out_ptr="*fp16", eps="fp32"),
        dict(HAS_RESIDUAL=False, ROWS=gpu_rows(128), BLOCK=128),
        dict(num_warps=num_warps_for(gpu_rows(128) * 128)),
    ),
    "rope_neox_bf16": (
        rope_triton._rope_kernel,
        dict(positions_ptr="*i64", q_ptr="*bf16", k_ptr="*bf16", cos_sin_ptr="*fp32"),
        dict(HALF=64, HALF_PAD=64, ROWS=gpu_rows(64), IS_NEOX=True),
        dict(num_warps=num_warps_for(gpu_rows(64) * 64)),
    ),
    "rope_interleaved_partial_fp16": (
        rope_triton._rope_kernel,
        dict(positions_ptr="*i32", q_ptr="*fp16", k_ptr="*fp16", cos_sin_ptr="*fp32"),
        dict(HALF=12, HALF_PAD=16, ROWS=gpu_rows(16), IS_NEOX=False),
        dict(num_warps=num_warps_for(gpu_rows(16) * 16)),
    ),
    "silu_and_mul_bf16": (
        activation_triton._silu_and_mul_kernel, dict(x_ptr="*bf16", out_ptr="*bf16"),
        dict(ROWS=gpu_rows(1024), BLOCK=1024),
        dict(num_warps=num_warps_for(gpu_rows(1024) * 1024)),
    ),
}


ALIGNED_INTS = {
    "stride_q_tok", "stride_q_head", "stride_o_tok", "stride_o_head", "stride_k_blk",
    "stride_k_slot", "stride_k_head", "stride_v_blk", "stride_v_slot", "stride_v_head",
    "stride_key_tok", "stride_key_head", "stride_value_tok", "stride_value_head",
    "stride_x", "stride_residual", "stride_out", "stride_residual_out", "stride_tok",
    "stride_cache_pos", "hidden", "d",
}


def compile_variant(name: str, arch: int, ptxas_info: bool) -> dict:
    fn, pointer_types, constexprs, options = VARIANTS[name]
    signature = {
        arg: "constexpr" if arg in constexprs else pointer_types.get(arg, "i32")
        for arg in fn.arg_names
    }
    # The launcher marks pointers and integers that are multiples of 16 as such; strides of
    # real caches and activations are, and without it no load is vectorised or pipelined.
    aligned = {
        (i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
        if arg not in constexprs and (signature[arg].startswith("*") or arg in ALIGNED_INTS)
    }
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(fn, signature, constexprs, aligned),
                              target=GPUTarget("cuda", arch, 32), options=options)
    result = {"variant": name, "arch": arch, "ok": True,
              "compile_s": round(time.perf_counter() - start, 2),
              "shared_bytes": compiled.metadata.shared,
              # cp.async copies in the loop: K/V tiles stream while the previous tile computes.
              "pipelined_loads": compiled.asm["ttgir"].count("async_copy_global_to_local")}
    if ptxas_info:
        result["ptxas"] = _ptxas_info(compiled.asm["ptx"], arch)
    return result


def _ptxas_info(ptx: str, arch: int) -> str:
    # Registers and spills as ptxas reports them (no device needed).
    from triton.backends.nvidia import compiler as nvidia_compiler

    if hasattr(nvidia_compiler, "get_ptxas"):  # triton >= 3.7 picks a ptxas per arch
        ptxas = nvidia_compiler.get_ptxas(arch).path
    else:
        ptxas = triton.knobs.nvidia.ptxas.path
    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([str(ptxas), f"-arch=sm_{arch}{suffix}", "-v", str(src),
                               "-o", str(Path(tmp) / "k.cubin")], capture_output=True, text=True)
    lines = [ln.split("info    : ")[-1] for ln in done.stderr.splitlines() if "Used" in ln
             or "spill" in ln]
    return "; ".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="SM version, e.g. 80 or 90")
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS), help="variants to build")
    parser.add_argument("--ptxas-info", action="store_true", help="report registers/spills")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter cannot compile kernels")
    failed = 0
    for name in args.only or VARIANTS:
        try:
            result = compile_variant(name, args.arch, args.ptxas_info)
        except Exception as exc:  # report every variant, not just the first failure
            result = {"variant": name, "arch": args.arch, "ok": False,
                      "error": f"{type(exc).__name__}: {exc}"[:2000]}
            failed += 1
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
