"""The native CPU kernels of two commits side by side in one process: each commit's
kernels/cpu sources built (build.py's flags) into their own library, then decode attention
and the bf16 GEMV of a model's shapes timed in turns, the order alternating, with a check
that both builds give the same bits (a change meant to be only faster must keep them).

    python benchmarks/bench_cpu_kernel_ab.py --base 5b89bc9 --context 1100 --rows 1,5 \
        --out benchmarks/results/cpu_kernel_ab_attention_groups.json

Attention: a verify's rows of one request (row i sees the context plus i + 1 tokens), over
the model's heads, kv heads and head dim, every layer. GEMV: every projection of a step
and the output head (bench_cpu_gemv.py's shapes). Times are per step (all layers); the
ratio is base over new, per pair, so above 1 the new commit is faster.
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
# (layers, hidden, intermediate, q heads, kv heads, head dim, vocab), as bench_cpu_gemv.py
MODELS = {"demo": (6, 256, 768, 4, 2, 64, 4096), "smollm2": (30, 576, 1536, 9, 3, 64, 49152)}
BLOCK_SIZE = 16


def build(commit: str | None, into: Path) -> ctypes.CDLL:
    """The kernels of `commit` (None: the working tree) as a library in `into`."""
    from kvdeck.kernels.cpu import build as cpu_build

    names = [path.name for path in (*cpu_build.SOURCES, *cpu_build.HEADERS)]
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = REPO / "kernels" / "cpu" / name
        if commit is None:
            text = source.read_text()
        else:
            text = subprocess.run(["git", "show", f"{commit}:kernels/cpu/{name}"], cwd=REPO, check=True,
                                  capture_output=True, text=True).stdout
        (into / name).write_text(text)
    library = into / "kernels.so"
    sources = [str(into / path.name) for path in cpu_build.SOURCES]
    subprocess.run([os.environ.get("CC") or "cc", *cpu_build.flags(), *sources, "-o", str(library)],
                   check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(library))


def attention_step(lib: ctypes.CDLL, shape: tuple, rows: int, context: int):
    layers, _, _, heads, kv_heads, dim, _ = shape
    blocks = (context + rows) // BLOCK_SIZE + 2
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).bfloat16()
    v = torch.randn(blocks, BLOCK_SIZE, kv_heads, dim, generator=gen).bfloat16()
    q = torch.randn(rows, heads, dim, generator=gen).bfloat16()
    tables = torch.arange(blocks, dtype=torch.int32).repeat(rows, 1).contiguous()
    lens = torch.tensor([context + i + 1 for i in range(rows)], dtype=torch.int32)
    out = torch.empty(rows, heads, dim, dtype=torch.bfloat16)
    fn = lib.kvdeck_decode_attention_bf16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_float,
                   ctypes.c_void_p]
    args = (q.data_ptr(), rows, q.stride(0), heads, dim, k.data_ptr(), v.data_ptr(), kv_heads,
            tables.data_ptr(), tables.stride(0), lens.data_ptr(), BLOCK_SIZE, 0, dim ** -0.5, 0.0,
            out.data_ptr())
    keep = (q, k, v, tables, lens)  # args holds their addresses only

    def step() -> torch.Tensor:
        assert keep
        for _ in range(layers):
            if fn(*args) != 0:
                raise RuntimeError("decode attention refused the call")
        return out

    return step


def gemv_step(lib: ctypes.CDLL, shape: tuple, rows: int):
    layers, hidden, inter, heads, kv_heads, dim, vocab = shape
    shapes = [((heads + 2 * kv_heads) * dim, hidden), (hidden, heads * dim), (2 * inter, hidden),
              (hidden, inter)] * layers + [(vocab, hidden)]
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(n, k, generator=gen).bfloat16() for n, k in shapes]  # streamed, as a step's
    xs = {k: torch.randn(rows, k, generator=gen).bfloat16() for _, k in shapes}
    ys = [torch.empty(rows, n, dtype=torch.bfloat16) for n, _ in shapes]
    fn = lib.kvdeck_gemv_bf16
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def step() -> torch.Tensor:
        for w, y in zip(weights, ys):
            n, k = w.shape
            if fn(xs[k].data_ptr(), rows, k, w.data_ptr(), n, k, None, y.data_ptr(), n) != 0:
                raise RuntimeError("the GEMV refused the call")
        return torch.cat([y.flatten() for y in ys])

    return step


def pairs(base, new, rounds: int, repeat: int) -> dict:
    times: dict[str, list[float]] = {"base": [], "new": []}
    for index in range(rounds):
        order = (("base", base), ("new", new)) if index % 2 == 0 else (("new", new), ("base", base))
        for name, step in order:
            started = time.perf_counter()
            for _ in range(repeat):
                step()
            times[name].append((time.perf_counter() - started) / repeat)
    ratios = [b / n for b, n in zip(times["base"], times["new"])]
    return {"step_s": times, "base_over_new_per_pair": ratios,
            "base_over_new_median": statistics.median(ratios)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--new", default=None, help="the commit to measure (default: the working tree)")
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--kernels", default="attention,gemv")
    parser.add_argument("--rows", default="1,5", help="rows of a step (a verify's k + 1)")
    parser.add_argument("--context", type=int, default=1100, help="attention: tokens before the step")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="steps timed per side per round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.kernels.cpu import native as cpu_native

    if not cpu_native.available():
        print("needs the native CPU kernels (an x86 CPU with AVX512-BF16 and a C compiler)")
        return 1
    shape = MODELS[args.model]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvdeck-kernel-ab-") as scratch:
        libs = {"base": build(args.base, Path(scratch) / "base"),
                "new": build(args.new, Path(scratch) / "new")}
        figures: dict[str, dict] = {}
        for kernel in args.kernels.split(","):
            for rows in [int(r) for r in args.rows.split(",")]:
                if kernel == "attention":
                    steps = {name: attention_step(lib, shape, rows, args.context)
                             for name, lib in libs.items()}
                elif kernel == "gemv":
                    steps = {name: gemv_step(lib, shape, rows) for name, lib in libs.items()}
                else:
                    raise SystemExit(f"unknown kernel {kernel!r}: attention or gemv")
                same = torch.equal(steps["base"]().clone(), steps["new"]().clone())
                result = pairs(steps["base"], steps["new"], args.rounds, args.repeat)
                result["bits_equal"] = same
                figures[f"{kernel}_rows{rows}"] = result
                base_ms = statistics.median(result["step_s"]["base"]) * 1e3
                new_ms = statistics.median(result["step_s"]["new"]) * 1e3
                print(f"{kernel:9s} rows {rows}: base {base_ms:7.2f} ms  new {new_ms:7.2f} ms  "
                      f"base/new {result['base_over_new_median']:.3f} "
                      f"({min(result['base_over_new_per_pair']):.2f}-{max(result['base_over_new_per_pair']):.2f})"
                      f"  bits equal: {same}")
    config = {"base": args.base, "new": args.new or "working tree", "model": args.model,
              "context": args.context, "rounds": args.rounds, "repeat": args.repeat,
              "threads": torch.get_num_threads(),
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("cpu_kernel_ab", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
