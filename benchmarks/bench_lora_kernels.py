"""The LoRA kernels' launch configs on a GPU (kernels/triton/lora_plan.py), at multi-LoRA's decode
target: what a decode step's adapters cost, every LoRA linear of every layer, per candidate.

    python benchmarks/bench_lora_kernels.py --out benchmarks/results/lora_kernels_<gpu>.json
    python benchmarks/bench_lora_kernels.py --smoke --out ...   # the CPU form: the interpreter, no figure

Shapes from the Qwen3-0.6B config (benchmarks/configs): each layer's fused q/k/v, o, fused
gate/up and down, with their own slot weights per layer (28 layers: the weights do not all sit
in L2, as in the engine); `--rows` decoding rows (64) spread over `--adapters` slots (8) at
rank 16, launched as the adapter decode graphs launch them (every row, each slot's rank read
from device memory; the grouped kernels over the graphs' tile buffer, 11 tiles of which the 8
slots' rows use 8). The candidates are the per-row kernels' and the grouped ones' launch
forms (kernels/triton/lora.py, lora_grouped.py). One candidate's step, every layer's linears with their
deltas (the base GEMM, bf16 cuBLAS, and the LoRA launches, as `Linear.forward` runs them: an
`overlap` candidate's shrink beside the GEMM on a side stream), is captured in one CUDA graph;
candidates alternate round by round and each one's figure is its median (w4a16_sweep.py's
timer). The same linears without adapters (the GEMMs alone) are timed the same way: a row's
`over_base_gemms` is what adapters cost those linears. Each candidate's output is checked
against the torch reference before it is timed.
The fastest is then timed again beside itself launched with programmatic dependent launch
(`pdl`: kernels/triton/pdl.py, KVDECK_PDL=1). The JSON (rewritten as it goes) names the
fastest; benchmarks/lora_tune.py writes it into kernels/triton/lora_tuned.py. `--smoke`: tiny
shapes under TRITON_INTERPRET=1, each candidate checked, timings from a fake clock.
"""

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

STARTED = time.monotonic()  # --budget-s counts from here (torch's import and the weights included)
if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from kvdeck.kernels.reference.lora import lora_linear_delta  # noqa: E402
from kvdeck.kernels.reference.lora_tiles import RowTiles, max_row_tiles, row_tiles  # noqa: E402
from kvdeck.kernels.triton.lora_plan import DEFAULT_CONFIG, GROUP_ROWS, LoRAKernelConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_adapters import projection_shapes  # noqa: E402
from w4a16_sweep import time_alternating  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QWEN3_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"
# The candidates: every split of K (0: one program per row walks it all), expand block and
# warp count, in two launches (the shrink in line or beside the base GEMM) and fused.
# Tried in order of (warps, block_n, split_k), each in its three forms, the values below in
# the order given (a budget cuts the tail): every split at 4 warps and 128 outputs first.
SPLIT_K = (256, 128, 512, 0)
BLOCK_N = (128, 64, 256)
NUM_WARPS = (4, 2)
# The grouped kernels (tiles of one adapter's rows, kernels/triton/lora_grouped.py) as
# (split_k, block_n, fused, overlap): the three forms at 128 outputs first, then other
# splits and blocks (a fused program's K step does not depend on the split: only 0 there).
# After the two every figure is compared with, they alternate with the per-row candidates.
GROUPED = ((0, 128, True, False), (256, 128, False, False), (256, 128, False, True), (128, 128, False, False),
           (0, 64, True, False), (0, 128, False, False), (256, 64, False, False), (0, 256, True, False),
           (128, 128, False, True), (512, 128, False, False))
# Of --budget-s for checking candidates, which compiles their kernels (a new launch shape
# compiles 4-5 variants, seconds on a GPU host); timing one takes ~0.2 s.
CHECK_SHARE = 0.8


# The launch the H200 run of 2026-11-29 measured (2.45x the base step): one program per row
# walking all of K, 64 outputs per expand program.
FIRST_LAUNCH = LoRAKernelConfig(split_k=0, block_n=64)


def candidates(smoke: bool) -> list[LoRAKernelConfig]:
    if smoke:
        grid = [(0, 16, 4, False, False), (16, 32, 4, False, True), (16, 16, 2, True, False)]
        grouped = [(16, 16, False, False), (0, 32, True, False), (16, 16, False, True)]
    else:
        forms = ((False, False), (False, True), (True, False))  # (fused, overlap)
        grid = [(s, n, w, *form) for w, n, s, form in itertools.product(NUM_WARPS, BLOCK_N, SPLIT_K, forms)]
        grouped = GROUPED
    per_row = [LoRAKernelConfig(split_k=s, block_n=n, num_warps=w, fused=f, overlap=o)
               for s, n, w, f, o in grid]
    tiled = [LoRAKernelConfig(split_k=s, block_n=n, fused=f, overlap=o, grouped=True)
             for s, n, f, o in grouped]
    first = [DEFAULT_CONFIG, FIRST_LAUNCH]  # the two every figure is compared with
    per_row = [c for c in per_row if c not in first]
    mixed = [c for pair in itertools.zip_longest(tiled, per_row) for c in pair if c is not None]
    return first + mixed


# A decoder layer's LoRA linears as the engine fuses them: (name, its projections).
FUSED_LINEARS = (("qkv", ("q_proj", "k_proj", "v_proj")), ("o", ("o_proj",)),
                 ("gate_up", ("gate_proj", "up_proj")), ("down", ("down_proj",)))


def linear_shapes(config_path: Path) -> list[tuple[str, int, list[int]]]:
    """(name, in_size, output_sizes) of a decoder layer's LoRA linears."""
    shapes = projection_shapes(json.loads(config_path.read_text()))
    return [(name, shapes[parts[0]][0], [shapes[part][1] for part in parts]) for name, parts in FUSED_LINEARS]


class Layers:
    """Every layer's slot weights, inputs and outputs for one step (the graphs' form)."""

    def __init__(self, shapes, layers: int, rows: int, adapters: int, rank: int, dtype, device) -> None:
        gen = torch.Generator(device="cpu").manual_seed(0)

        def rand(*shape: int, scale: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)

        self.shapes, self.rank = shapes, rank
        self.weights = [[(rand(len(sizes), adapters, rank, in_size, scale=in_size ** -0.5),
                          rand(sum(sizes), adapters * rank, scale=rank ** -0.5),
                          rand(sum(sizes), in_size, scale=in_size ** -0.5))
                         for _, in_size, sizes in shapes] for _ in range(layers)]
        self.x = {in_size: rand(rows, in_size, scale=1.0) for _, in_size, _ in shapes}
        self.out = {name: torch.zeros(rows, sum(sizes), dtype=dtype, device=device)
                    for name, _, sizes in shapes}
        self.row_slots = torch.arange(rows, device=device) % adapters  # every row under an adapter
        self.slot_ranks = torch.full((adapters,), rank, dtype=torch.int32, device=device)
        # The grouped kernels' tiles as the adapter decode graphs hold them: as many tiles as
        # any mix of the rows over the slots could need, the unused ones empty.
        num_tiles = max_row_tiles(rows, adapters, GROUP_ROWS)
        packed = row_tiles(self.row_slots.cpu().numpy(), GROUP_ROWS, num_tiles, rows)
        self.tiles = RowTiles.from_packed(torch.from_numpy(packed).to(device), num_tiles)

    def linear(self, config, x, base, a, b, sizes) -> torch.Tensor:
        """One linear with its adapters' deltas, in `config`'s kernels and launch form."""
        from kvdeck.kernels.triton.lora import lora_linear_triton
        from kvdeck.kernels.triton.lora_grouped import grouped_linear

        if config.grouped:
            return grouped_linear(x, base, a, b, self.tiles, self.slot_ranks, sizes, self.rank, config)
        return lora_linear_triton(x, base, a, b, None, self.row_slots, sizes, self.rank, self.slot_ranks,
                                  config)

    def lora_step(self, config) -> None:
        """Every layer's linears with their adapters' deltas."""
        for layer in self.weights:
            for (name, in_size, sizes), (a, b, w) in zip(self.shapes, layer):
                def base(x, w=w, out=self.out[name]):
                    return torch.matmul(x, w.t(), out=out)
                self.linear(config, self.x[in_size], base, a, b, sizes)

    def base_step(self) -> None:
        for layer in self.weights:
            for (name, in_size, _), (_, _, w) in zip(self.shapes, layer):
                torch.matmul(self.x[in_size], w.t(), out=self.out[name])

    def check(self, config) -> float:
        """The largest difference from the torch reference on layer 0 (a fresh output), over
        the reference's largest magnitude; on CUDA from a replay of the launches captured in a
        graph, as they are timed (an overlapped shrink's branch included)."""
        worst = 0.0
        for (_, in_size, sizes), (a, b, _) in zip(self.shapes, self.weights[0]):
            x = self.x[in_size]
            start = torch.randn(x.shape[0], sum(sizes), device=x.device).to(x.dtype)
            out = torch.empty_like(start)

            def run(a=a, b=b, sizes=sizes, x=x, start=start, out=out) -> torch.Tensor:
                return self.linear(config, x, lambda _: out.copy_(start), a, b, sizes)

            got = run()  # compiles the variants before any capture
            if x.is_cuda:
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    got = run()
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
            want = lora_linear_delta(x.float(), start.float(), a.float(), b.float(), None, self.row_slots,
                                     sizes, self.rank)
            worst = max(worst, ((got.float() - want).abs().max() / want.abs().max()).item())
        return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--layers", type=int, default=None, help="default: the config's")
    parser.add_argument("--model-config", default=str(QWEN3_CONFIG))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep-ms", type=float, default=20.0, help="graph length per timing")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds from the start: stop checking new candidates after %.0f%%%% of "
                             "them and time those checked (the battery's stage cap)" % (CHECK_SHARE * 100))
    parser.add_argument("--smoke", action="store_true", help="the CPU form: interpreter, tiny, fake clock")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from kvdeck.kernels.triton.launch import device_arch

    if args.smoke:
        device, dtype, mode = torch.device("cpu"), torch.float32, "fake"
        shapes = [("qkv", 32, [32, 16, 16]), ("o", 32, [32]), ("gate_up", 32, [48, 48]), ("down", 48, [32])]
        args.rows, args.adapters, args.rank, layers = 5, 2, 4, 2
    elif torch.cuda.is_available():
        device, dtype, mode = torch.device("cuda"), torch.bfloat16, "graph"
        shapes = linear_shapes(Path(args.model_config))
        layers = args.layers or json.loads(Path(args.model_config).read_text())["num_hidden_layers"]
    else:
        print("the sweep needs a CUDA GPU (--smoke runs the CPU form)", file=sys.stderr)
        return 2
    config = {"model_config": args.model_config, "rows": args.rows, "adapters": args.adapters,
              "rank": args.rank, "layers": layers, "shapes": shapes, "dtype": str(dtype),
              "smoke": args.smoke, "arch": device_arch(device), "load_average_before": os.getloadavg(),
              "timing": "a step's LoRA linears (base GEMMs and deltas), all layers, replayed in one "
                        "CUDA graph; median of alternating rounds"}
    figures: dict = {"rows": []}

    def save() -> None:
        figures["load_average_now"] = os.getloadavg()
        if args.out:
            write_json_atomic(Path(args.out), build_result("lora_kernels", config, figures))

    step = Layers(shapes, layers, args.rows, args.adapters, args.rank, dtype, device)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 rounding of the output
    runnable = {}
    check_until = STARTED + args.budget_s * CHECK_SHARE if args.budget_s else None
    for candidate in candidates(args.smoke):
        if check_until is not None and time.monotonic() > check_until and len(runnable) >= 2:
            figures["rows"].append({"config": candidate.label(), "skipped": "past the sweep's budget"})
            continue
        try:
            error = step.check(candidate)
        except Exception as exc:  # a config this GPU cannot run: recorded, not timed
            error_text = f"{type(exc).__name__}: {exc}"[:300]
        else:
            error_text = f"off the reference by {error:.3g} of its largest" if error > tolerance else None
        if error_text:
            figures["rows"].append({"config": candidate.label(), "error": error_text})
            continue
        runnable[candidate.label()] = candidate
    save()
    if not runnable:
        print("no candidate ran and matched the reference: nothing to time", file=sys.stderr)
        return 1
    fns = {label: (lambda c=c: step.lora_step(c)) for label, c in runnable.items()}
    fns["base_gemms"] = step.base_step
    timed = time_alternating(fns, mode, args.rep_ms, args.rounds)
    base_ms = timed.pop("base_gemms")
    for label, ms in sorted(timed.items(), key=lambda item: item[1]):
        figures["rows"].append({"config": label, "fused": runnable[label].fused,
                                "overlap": runnable[label].overlap, "grouped": runnable[label].grouped,
                                "step_ms": ms,
                                "lora_ms": ms - base_ms, "over_base_gemms": ms / base_ms})
    best = min(timed, key=timed.get)
    first = FIRST_LAUNCH.label()
    default = DEFAULT_CONFIG.label()
    figures.update(base_gemms_step_ms=base_ms, best=best, best_step_ms=timed[best],
                   default=default, default_step_ms=timed.get(default),
                   best_over_default=timed[best] / timed[default] if default in timed else None,
                   first_launch=first, first_launch_step_ms=timed.get(first),
                   best_over_first_launch=timed[best] / timed[first] if first in timed else None)
    save()
    # The pick again beside itself under programmatic dependent launch (KVDECK_PDL=1,
    # kernels/triton/pdl.py; sm_90 on, elsewhere the plain launch): what PDL buys a step's
    # chain of small launches. The cuBLAS GEMMs take no part.
    from kvdeck.kernels.triton.launch import pdl_forced

    try:
        with pdl_forced(True):
            step.check(runnable[best])  # under PDL too, from a graph replay
        pdl_timed = time_alternating({"best": fns[best], "best_pdl": pdl_forced(True)(fns[best])}, mode,
                                     args.rep_ms, args.rounds)
    except Exception as error:  # recorded: the sweep's pick stands either way
        figures["pdl"] = {"config": best, "error": f"{type(error).__name__}: {error}"[:500]}
    else:
        figures["pdl"] = {"config": best, "step_ms": pdl_timed["best"], "pdl_step_ms": pdl_timed["best_pdl"],
                          "pdl_speedup": pdl_timed["best"] / pdl_timed["best_pdl"]}
    save()
    for row in figures["rows"][:8]:
        print(json.dumps(row))
    print(f"best {best}: {timed[best]:.3f} ms/step of LoRA linears (default {default}: "
          f"{timed.get(default, float('nan')):.3f}; the first launch {first}: "
          f"{timed.get(first, float('nan')):.3f}); the same linears without adapters {base_ms:.3f} ms "
          f"({timed[best] / base_ms:.2f}x at best); under PDL: {json.dumps(figures['pdl'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
