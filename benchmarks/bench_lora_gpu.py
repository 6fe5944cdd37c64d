"""Multi-LoRA decode on a GPU (its target: <= 1.2x the base): a batch of 64 decoding requests under 8
distinct rank-16 adapters against the same batch on the base alone, decode step time, both
sides replaying CUDA graphs (the adapter graphs and the plain ones).

    python benchmarks/bench_lora_gpu.py --out benchmarks/results/lora_gpu_<gpu>.json
    python benchmarks/bench_lora_gpu.py --smoke --model DIR --out ...   # the CPU form, no figure

The Qwen3-0.6B config with dummy bf16 weights; random adapters on every projection
(benchmarks/lora_adapters.py: the GPU image has no peft). One engine (enable_lora, max_loras 8,
max_lora_rank 16, max_num_seqs 64, max_model_len 256 so few split tiers are captured,
synchronous scheduling so each step is timed alone) serves both sides. A run adds the
batch's requests (random 32-token prompts; on the lora side request i uses adapter i % 8),
steps until every request decodes, then times `--steps` decode steps (wall clock of the
engine's step, the device synchronised) and takes their median. Runs alternate base, lora,
lora, base, ... (`--pairs` of each); the figure is the median of the per-pair lora / base
ratios. Target: <= 1.2. The JSON is rewritten after every run, with how many adapter steps
replayed the adapter graphs, how many decode steps fell back to the eager forward, and how
many kernel variants compiled after start-up (the start-up warm-up's LoRA ranks should leave
none: `kernel_compiles_first_adapter_steps`, `kernel_compiles_after_start`).
`--config-from SWEEP_JSON` serves the LoRA kernels under the launch config that
bench_lora_kernels.py found fastest (`benchmarks/run_gpu.sh lora` runs that sweep first), before
anyone commits it to kernels/triton/lora_tuned.py; the JSON names the config it ran.
After the pairs, `PROFILED_STEPS` steps of each side run under torch.profiler (step_kernels.py):
`kernels.base` and `kernels.lora` say where a step's time went (device time by kind, the LoRA
kernels' launches and time, the device's idle time: host work it waited for).
`--smoke`: the tiny model on the CPU, the graphs' static buffers replayed eagerly, tiny sizes.
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvdeck import LLM, LoRARequest
from kvdeck.app.bench.compiles import kernel_compiles
from kvdeck.app.bench.result import build_result, write_json_atomic
from kvdeck.kernels.triton.launch import device_arch
from kvdeck.kernels.triton.lora_plan import lora_kernel_config, parse_config, use_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_adapters import write_random_adapter  # noqa: E402
from step_kernels import decoding, profile_steps_or_error, summary_line  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QWEN3_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"
TARGET_RATIO = 1.2
PROFILED_STEPS = 10  # each side's decode steps under the profiler, after the timed pairs


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_step_s(llm: LLM, prompts: list[list[int]], loras: list, steps: int) -> float:
    """The median wall time of `steps` decode steps of the whole batch."""
    engine, core = llm.engine, llm.engine.core
    times = []
    with decoding(llm, prompts, steps + 8, loras):
        for _ in range(steps):
            _synchronize()
            started = time.perf_counter()
            engine.step()
            _synchronize()
            times.append(time.perf_counter() - started)
            if core.last_step.num_seqs != len(prompts) or core.last_step.prefill_tokens:
                raise RuntimeError("a timed step was not a decode step of the whole batch")
    return statistics.median(times)


class GraphUse:
    """Counts the adapter decode steps that replayed the adapter graphs and those that ran
    the eager forward (prefill steps run eagerly anyway and are not counted)."""

    def __init__(self, llm: LLM) -> None:
        self.graphs = self.eager = 0
        manager = llm.engine.core.runner.lora
        graph_slots, forward = manager.graph_token_slots, manager.forward

        def counted_graph(plan):
            self.graphs += 1
            return graph_slots(plan)

        def counted_eager(model, input_ids, positions, meta, plan):
            self.eager += meta.max_query_len == 1
            return forward(model, input_ids, positions, meta, plan)

        manager.graph_token_slots, manager.forward = counted_graph, counted_eager


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-lora-rank", type=int, default=16,
                        help="the slots' rank (the graphs' capture rank)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=256,
                        help="short: few split tiers to capture (the stage's start-up is most of its time)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="the CPU form: tiny model and sizes, no figure")
    parser.add_argument("--model", default=None, help="--smoke: the tiny model's folder")
    parser.add_argument("--config-from", type=Path, default=None,
                        help="a bench_lora_kernels.py JSON: serve its fastest launch config (lora_tune.py's "
                             "pick) instead of the committed one")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.smoke:
        if args.model is None:
            parser.error("--smoke needs --model")
        args.requests, args.adapters, args.steps, args.pairs = 6, 2, 2, 1
    elif not torch.cuda.is_available():
        print("the GPU target needs a CUDA GPU (--smoke runs the CPU form)", file=sys.stderr)
        return 2
    arch = device_arch(torch.device("cuda")) if torch.cuda.is_available() else None
    config_note = None
    if args.config_from is not None:  # a sweep cut short or failed: the committed config serves
        sweep = json.loads(args.config_from.read_text()) if args.config_from.exists() else {}
        if "best" in sweep:
            use_config(arch, parse_config(sweep["best"]))
        else:
            config_note = f"{args.config_from} names no fastest config: the committed one served"
            print(config_note, file=sys.stderr)
    model = args.model or str(QWEN3_CONFIG)
    model_dir = Path(model).parent if Path(model).is_file() else Path(model)
    config = {"model": model, "requests": args.requests, "adapters": args.adapters, "rank": args.rank,
              "max_lora_rank": args.max_lora_rank, "prompt_len": args.prompt_len, "steps": args.steps,
              "max_model_len": args.max_model_len, "lora_kernel_config": lora_kernel_config(arch).label(),
              "config_from": str(args.config_from) if args.config_from and not config_note else None,
              "config_note": config_note,
              "pairs": args.pairs, "smoke": args.smoke, "load_average_before": os.getloadavg(),
              "timing": "median wall time of a decode step (device synchronised), synchronous scheduling"}
    figures: dict = {"step_s": {"base": [], "lora": []}, "lora_over_base_per_pair": []}

    def save() -> None:
        figures["load_average_now"] = os.getloadavg()
        if args.out:
            write_json_atomic(Path(args.out), build_result("lora_gpu", config, figures))

    engine_args = dict(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.max_lora_rank,
                       max_num_seqs=args.requests, max_model_len=args.max_model_len, load_format="dummy",
                       seed=0, async_scheduling=False)
    if args.smoke:
        engine_args.update(device="cpu", dtype="float32", kv_cache_memory_gib=0.01)
    else:
        engine_args.update(dtype="bfloat16", gpu_memory_utilization=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(f"adapter{i}", i + 1,
                             str(write_random_adapter(model_dir, Path(tmp) / f"a{i}", args.rank, i)))
                 for i in range(args.adapters)]
        with LLM(model, **engine_args) as llm:
            runner = llm.engine.core.runner
            if args.smoke:  # the graphs' static-buffer path, replayed eagerly (no CUDA here)
                runner.capture_decode_graphs(llm.engine.core.max_model_len, capture=False)
            graphs = runner.decode_graphs
            figures["graphs_captured"] = graphs is not None
            figures["adapter_graphs_captured"] = graphs is not None and bool(graphs.lora_replays)
            use = GraphUse(llm)
            vocab = llm.engine.info.vocab_size
            rng = random.Random(0)
            sides = {"base": [None] * args.requests,
                     "lora": [loras[i % args.adapters] for i in range(args.requests)]}

            def prompts() -> list[list[int]]:
                return [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]

            # Kernel variants compiled after start-up (whose warm-up compiles one LoRA rank of
            # each class Triton specialises on): 0 when it covered the adapters' steps.
            compiles_at_start = kernel_compiles(llm)
            decode_step_s(llm, prompts(), sides["lora"], 2)  # warm: the adapters into their slots
            figures["kernel_compiles_first_adapter_steps"] = kernel_compiles(llm) - compiles_at_start
            for pair in range(args.pairs):
                for side in ("base", "lora") if pair % 2 == 0 else ("lora", "base"):
                    step = decode_step_s(llm, prompts(), sides[side], args.steps)
                    figures["step_s"][side].append(step)
                    print(f"pair {pair} {side}: {step * 1e3:.3f} ms/step", flush=True)
                    save()
                ratio = figures["step_s"]["lora"][-1] / figures["step_s"]["base"][-1]
                figures["lora_over_base_per_pair"].append(ratio)
                median = statistics.median(figures["lora_over_base_per_pair"])
                figures.update(lora_over_base_median=median, target_ratio=TARGET_RATIO,
                               meets_target=median <= TARGET_RATIO,
                               adapter_steps_on_graphs=use.graphs, adapter_decode_steps_eager=use.eager,
                               kernel_compiles_after_start=kernel_compiles(llm) - compiles_at_start)
                save()
            # After the target's figure: where each side's step went (device time by kind, the
            # device's idle time), from a few more steps under torch.profiler.
            figures["kernels"] = {}
            for side in ("base", "lora"):
                with decoding(llm, prompts(), PROFILED_STEPS + 8, sides[side]):
                    figures["kernels"][side] = profile_steps_or_error(llm.engine.step, PROFILED_STEPS)
                print(f"{side} profiled: {summary_line(figures['kernels'][side])}", flush=True)
                save()
    median = figures["lora_over_base_median"]
    print(f"{args.adapters} rank-{args.rank} adapters / base-only decode step at {args.requests} requests: "
          f"{median:.3f}x (target <= {TARGET_RATIO}); adapter steps on graphs {use.graphs}, "
          f"eager {use.eager}; kernel compiles after start-up {figures['kernel_compiles_after_start']}")
    if args.out:
        print(f"wrote {args.out}")
    return 0 if figures["adapter_graphs_captured"] and use.eager == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
