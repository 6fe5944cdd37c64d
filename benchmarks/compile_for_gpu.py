"""Compile every Triton kernel for CUDA targets ahead of time, without a GPU.

    python benchmarks/compile_for_gpu.py [--arch 80 86 89 90] [--only NAME ...] [--jobs N]
                                            [--markdown]

Builds each kernel the way its wrapper specialises it (dtypes, padded head dims, GQA
groups, split counts, W4A16 M buckets and groups: the variants of aot_variants.py) down to
a cubin with Triton's own toolchain, so code that only the interpreter ran is proven to
lower for real GPUs, and reports per variant and arch what would refuse a launch or slow
it: shared memory against the arch's per-block limit, registers and spills (the ptxas log
of the compile itself, so the figures are the cubin's), and loads pipelined through shared
memory; for the W4A16 GEMMs on sm_90, the K loop's machine code per weight (sass_loop.py).
Prints one JSON line per (variant, arch), or with --markdown the table of
kernels/README.md. Compiles run in a process pool with an empty Triton cache (a cached
kernel has no ptxas log).
Must run without TRITON_INTERPRET (the interpreter replaces `triton.jit`).
"""

import argparse
import contextlib
import inspect
import io
import json
import math
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # aot_variants beside this script
import sass_loop  # noqa: E402
from aot_variants import ARCHS, PDL_TWINS, SHARED_MEMORY_LIMIT, VARIANTS  # noqa: E402, F401 (PDL_TWINS: the tests)

SASS_ARCH = 90  # the W4A16 K loop's machine code is counted on Hopper (the lent GPUs' arch)

# Integer arguments the launcher would mark as multiples of 16 (strides of real caches,
# activations and weights, model dims); without the mark no load is vectorised or pipelined.
ALIGNED_INTS = {
    "stride_q_tok", "stride_q_head", "stride_o_tok", "stride_o_head", "stride_k_blk",
    "stride_k_slot", "stride_k_head", "stride_v_blk", "stride_v_slot", "stride_v_head",
    "stride_key_tok", "stride_key_head", "stride_value_tok", "stride_value_head",
    "stride_cache_blk", "stride_cache_slot", "stride_cache_head", "stride_s_blk", "stride_s_slot",
    "stride_x", "stride_residual", "stride_out", "stride_residual_out", "stride_tok",
    "stride_cache_pos", "hidden", "d",
    "stride_xm", "stride_qwk", "stride_qzg", "stride_sg", "stride_om", "stride_ok", "N", "K",
    "k_per_split", "stride_qwt", "stride_zg",
    "stride_qv", "stride_sv", "H", "V",  # the int8 head's rows (hidden sizes and their / 32), vocab
    "stride_k_tok",  # RoPE's keys: a token's q | k | v row
    # LoRA's slots and sums (ranks 16 and 64 times model dims): a launch's JIT marks them as it
    # marks any int argument that is a multiple of 16, and without the mark A and B were read
    # by 2-byte loads.
    "in_size", "rank", "stride_a_piece", "stride_a_slot", "stride_a_rank", "stride_h", "stride_split",
    "stride_b_slot", "stride_b_out",
}


# Triton emits the same PTX for sm_86 and sm_89 but for the .target line (Ada adds fp8,
# which no kernel here uses), so sm_89 reuses sm_86's PTX and only its ptxas runs (a
# quarter of the matrix for the cost of ptxas alone). DERIVATION_CHECKED compiles sm_89 in
# full as well and reports whether the two PTX texts agree (the test requires it).
DERIVED_FROM = {89: 86}
DERIVATION_CHECKED = ("attention_decode_bf16_d128_g4", "attention_prefill_bf16_d256_g8",
                      "w4a16_m16_bf16_g128_splitk")


def compile_variant(name: str, archs: list[int]) -> list[dict]:
    """Results for one variant on each arch (one job: sm_89 reuses sm_86's PTX)."""
    results, ptx_by_arch = [], {}
    for arch in archs:
        source = DERIVED_FROM.get(arch)
        start = time.perf_counter()
        try:
            if source in ptx_by_arch:
                usage = _assemble(ptx_by_arch[source], source, arch, VARIANTS[name].options)
                result = {**results[archs.index(source)], "arch": arch, "ptx_from": source,
                          **usage}
                if name in DERIVATION_CHECKED:
                    full = _compile(name, arch)[1]
                    result["ptx_matches_own"] = full == _retarget(ptx_by_arch[source], source, arch)
            else:
                result, ptx_by_arch[arch] = _compile(name, arch)
        except Exception as exc:  # report every variant, not just the first failure
            result = {"variant": name, "arch": arch, "triton": triton.__version__, "ok": False,
                      "error": f"{type(exc).__name__}: {exc}"[:2000]}
        results.append({**result, "compile_s": round(time.perf_counter() - start, 2)})
    return results


def _compile(name: str, arch: int) -> tuple[dict, str]:
    variant = VARIANTS[name].for_arch(arch)
    fn = variant.fn
    # A constexpr the variant leaves out takes its default (PDL: off), as a launch does.
    defaults = {param.name: param.default for param in inspect.signature(fn.fn).parameters.values()
                if param.default is not inspect.Parameter.empty}
    constexprs = {**defaults, **variant.constexprs}
    signature = {arg: "constexpr" if arg in constexprs else variant.pointer_types.get(arg, "i32")
                 for arg in fn.arg_names}
    aligned = {
        (i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
        if arg not in constexprs and (signature[arg].startswith("*") or arg in ALIGNED_INTS)
    }
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # where Triton prints the ptxas -v log
        compiled = triton.compile(ASTSource(fn, signature, constexprs, aligned),
                                  target=GPUTarget("cuda", arch, 32), options=variant.options)
    result = {
        "variant": name, "arch": arch, "triton": triton.__version__, "ok": True, "decode": variant.decode,
        "shared_bytes": compiled.metadata.shared, "shared_limit": SHARED_MEMORY_LIMIT[arch],
        **_ptxas_usage(log.getvalue()),
        # cp.async copies in the loop: tiles stream in while the previous tile computes.
        "pipelined_loads": compiled.asm["ttgir"].count("async_copy_global_to_local"),
        # The W4A16 lop3 dequantisation's instructions in the PTX (kernels/triton/w4a16_lop3.py).
        "lop3": compiled.asm["ptx"].count("lop3.b32"),
        # Programmatic dependent launch's wait (kernels/triton/pdl.py): only the PDL twins.
        "pdl_waits": compiled.asm["ptx"].count("griddepcontrol.wait"),
        "l2_prefetches": compiled.asm["ptx"].count("prefetch.global.L2"),
    }
    if name.startswith("w4a16") and arch == SASS_ARCH:
        result.update(_k_loop(compiled.asm["cubin"], variant))
    if name.startswith("attention") and arch == SASS_ARCH:  # the KV tile loop
        result["loop_sass"] = sum(sass_loop.largest_loop(compiled.asm["cubin"]).values())
    if name.startswith(("lora_shrink", "lora_expand")) and arch == SASS_ARCH:
        early, loads = sass_loop.loads_before_first_multiply(compiled.asm["cubin"])
        result.update(sass_loads=loads, sass_loads_before_first_multiply=early,
                      sass_loop_instructions=sum(sass_loop.largest_loop(compiled.asm["cubin"]).values()))
    return result, compiled.asm["ptx"]


def _k_loop(cubin: bytes, variant) -> dict:
    """The W4A16 GEMM's K loop in machine code (sass_loop.py): instructions per iteration and
    per weight each thread dequantises, the most frequent opcodes."""
    body = sass_loop.largest_loop(cubin)
    tile = variant.constexprs["BLOCK_K"] * variant.constexprs["BLOCK_N"]
    weights = tile / (32 * variant.options["num_warps"])
    total = sum(body.values())
    return {"k_loop_sass": total, "sass_per_weight": round(total / weights, 2),
            "k_loop_opcodes": dict(body.most_common(8))}


def _retarget(ptx: str, source: int, arch: int) -> str:
    return ptx.replace(f".target sm_{source}", f".target sm_{arch}", 1)


def _assemble(ptx: str, source: int, arch: int, options: dict) -> dict:
    """ptxas for `arch` on PTX made for `source`, as Triton itself runs it (same flags)."""
    backend = make_backend(GPUTarget("cuda", arch, 32))
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        backend.make_cubin(_retarget(ptx, source, arch), {}, backend.parse_options(options), arch)
    return {"shared_limit": SHARED_MEMORY_LIMIT[arch], **_ptxas_usage(log.getvalue())}


def _ptxas_usage(log: str) -> dict:
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if registers is None or spills is None:
        raise RuntimeError(f"no ptxas usage in the compile log:\n{log[-2000:]}")
    return {"registers": int(registers.group(1)),
            "spill_bytes": int(spills.group(1)) + int(spills.group(2))}


def _init_worker(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir  # empty: every compile runs ptxas and logs
    triton.knobs.nvidia.dump_ptxas_log = True


def compile_all(names: list[str], archs: list[int], jobs: int):
    """Yield each (variant, arch) result, variant by variant as the pool finishes them."""
    # Slowest first (attention, then W4A16) so the pool does not end on one long job.
    order = sorted(names, key=lambda name: (not name.startswith("attention"),
                                            not name.startswith("w4a16"), name))
    with tempfile.TemporaryDirectory(prefix="kvdeck-aot-") as cache_dir, \
            ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(cache_dir,)) as pool:
        futures = [pool.submit(compile_variant, name, archs) for name in order]
        for future in futures:
            yield from future.result()


def markdown_table(results: list[dict], archs: list[int]) -> str:
    """One row per variant: shared KiB / registers / spill bytes for each arch."""
    by_key = {(r["variant"], r["arch"]): r for r in results}
    lines = ["| variant | " + " | ".join(f"sm_{a}" for a in archs) + " |",
             "| --- |" + " --- |" * len(archs)]
    for name in dict.fromkeys(r["variant"] for r in results):
        cells = []
        for arch in archs:
            r = by_key.get((name, arch))
            if r is None or not r["ok"]:
                cells.append("failed" if r else "")
                continue
            kib = math.ceil(r["shared_bytes"] / 1024)
            spill = f" **{r['spill_bytes']} B spill**" if r["spill_bytes"] else ""
            cells.append(f"{kib} KiB / {r['registers']} r{spill}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS),
                        choices=sorted(SHARED_MEMORY_LIMIT), help="SM versions")
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS), help="variants to build")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter cannot compile kernels")
    results = []
    for result in compile_all(args.only or list(VARIANTS), args.arch, args.jobs):
        results.append(result)
        if not args.markdown:
            print(json.dumps(result), flush=True)
    if args.markdown:
        print(markdown_table(sorted(results, key=lambda r: list(VARIANTS).index(r["variant"])),
                             args.arch))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
