"""Where a decode step's time goes, per batch size: the step time, torch.profiler's top
operators (host and device) and cProfile's top Python functions, for one engine.

    python benchmarks/profile_decode.py --out benchmarks/results/profile_decode_<gpu>.json
    python benchmarks/profile_decode.py --enforce-eager ...     # the same without CUDA graphs
    python benchmarks/profile_decode.py --model DIR --load-format auto --dtype float32 \\
        --batch-sizes 1,2 --output-len 8                          # runs on CPU too (tested)

The first H100 run (benchmarks/results/gpu_h100_2026-11-28.log) measured a graph-replayed
decode step of Qwen3-0.6B at 1.9 ms for batch 1 and 11 ms for batch 8, and 20 ms eager at
batch 1: this names the operators and functions behind such figures. Each batch size runs
three times after a warm-up: timed alone, under cProfile, under torch.profiler.
`--lora-adapters N` (with `--lora-rank`) serves N random adapters (benchmarks/lora_adapters.py),
request i under adapter i % N, as multi-LoRA's GPU target does (`run_gpu.sh profile` runs
8 rank-16 at batch 64): the LoRA kernels' share of a step, by operator.
"""

import argparse
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvdeck import LLM, LoRARequest, SamplingParams
from kvdeck.app.bench.result import build_result, write_json_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_adapters import write_random_adapter  # noqa: E402
from step_kernels import profiler_breakdown, summary_line  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QWEN3_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams,
              loras: list[LoRARequest] | None = None) -> float:
    """Seconds for one run. No explicit synchronize: every engine step already waits for its
    sampled tokens on the host. The prefix cache is emptied so each run prefills alike."""
    llm.engine.reset_prefix_cache()
    started = time.perf_counter()
    llm.generate(prompts, params, lora_request=loras)
    return time.perf_counter() - started


def _python_functions(profile: cProfile.Profile, steps: int, top: int) -> list[dict]:
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls_per_step": calls / steps,
                     "self_ms_per_step": 1e3 * tottime / steps, "total_ms_per_step": 1e3 * cumtime / steps})
    rows.sort(key=lambda row: row["self_ms_per_step"], reverse=True)
    return rows[:top]


def _torch_operators(profiler: torch.profiler.profile, steps: int, top: int) -> dict[str, list[dict]]:
    events = profiler.key_averages()

    def device_us(event) -> float:  # renamed from cuda to device in torch 2.4
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)

    def rows(key) -> list[dict]:
        ranked = sorted(events, key=key, reverse=True)[:top]
        return [{"name": e.key, "calls_per_step": e.count / steps,
                 "self_host_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
                 "self_device_ms_per_step": device_us(e) / 1e3 / steps} for e in ranked]

    return {"by_host": rows(lambda e: e.self_cpu_time_total), "by_device": rows(device_us)}


def _step_phases(timings, elapsed: float, steps: int) -> dict[str, float]:
    """Where a step's time goes, in ms a step: the engine's own timers (the host's phases and
    the model with the sampler), and what is left outside them (LLM.generate's loop)."""
    phases = {"schedule": timings.schedule_s, "prepare_inputs": timings.prepare_s,
              "model_and_sampling": timings.model_s, "update_outputs": timings.update_s,
              "frontend": timings.frontend_s}
    phases["outside_steps"] = elapsed - sum(phases.values())
    return {name: 1e3 * seconds / steps for name, seconds in phases.items()}


def profile_batch(llm: LLM, batch: int, input_len: int, output_len: int, top: int,
                  adapters: list[LoRARequest] | None = None) -> dict:
    rng = random.Random(batch)
    vocab = llm.engine.info.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(input_len)] for _ in range(batch)]
    loras = [adapters[i % len(adapters)] for i in range(batch)] if adapters else None
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False), lora_request=loras)
    steps = output_len  # one prefill step (the prompts fit one) and output_len - 1 decode steps
    llm.engine.reset_timings()
    elapsed = _generate(llm, prompts, params, loras)
    phases = _step_phases(llm.engine.step_timings(), elapsed, steps)
    python_profile = cProfile.Profile()
    python_profile.enable()
    _generate(llm, prompts, params, loras)
    python_profile.disable()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as torch_profile:
        profiled = _generate(llm, prompts, params, loras)
    figures = {"ms_per_step": 1e3 * elapsed / steps, "output_tokens_per_s": batch * output_len / elapsed,
               "step_phases_ms": phases,
               "torch_operators": _torch_operators(torch_profile, steps, top),
               "python_functions": _python_functions(python_profile, steps, top),
               # Device time by kind and the device's idle share (the prefill step included).
               "kernels": profiler_breakdown(torch_profile, steps, profiled, top)}
    print(f"batch {batch:3d}: {figures['ms_per_step']:.3f} ms a step, "
          f"{figures['output_tokens_per_s']:.1f} output tok/s")
    print("  a step's time (ms): " + ", ".join(f"{name} {ms:.3f}" for name, ms in phases.items()))
    print(f"  device: {summary_line(figures['kernels'])}")
    tables = [("host", "self_host_ms_per_step", figures["torch_operators"]["by_host"]),
              ("device", "self_device_ms_per_step", figures["torch_operators"]["by_device"]),
              ("python", "self_ms_per_step", figures["python_functions"])]
    for title, key, rows in tables if torch.cuda.is_available() else tables[::2]:
        print(f"  top by {title} time (ms a step):")
        for row in rows:
            print(f"    {row[key]:8.3f}  {row.get('name') or row['function']}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(QWEN3_CONFIG))
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="default: the model's (graphs plan the attention split for it)")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=None)
    parser.add_argument("--lora-adapters", type=int, default=0,
                        help="serve this many random adapters, request i under adapter i %% N")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the JSON result here")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.output_len < 2 or min(batch_sizes) < 1:
        parser.error("--output-len must be at least 2 and every batch size at least 1")
    engine = {"load_format": args.load_format, "dtype": args.dtype, "enforce_eager": args.enforce_eager,
              "max_num_seqs": max(batch_sizes), "seed": 0}
    for name in ("max_model_len", "kv_cache_memory_gib"):
        if getattr(args, name) is not None:
            engine[name] = getattr(args, name)
    if args.lora_adapters:
        engine.update(enable_lora=True, max_loras=args.lora_adapters, max_lora_rank=args.lora_rank)
    config = {"model": args.model, "input_len": args.input_len, "output_len": args.output_len,
              "engine": engine, "lora_adapters": args.lora_adapters, "lora_rank": args.lora_rank}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model).parent if Path(args.model).is_file() else Path(args.model)
        adapters = [LoRARequest(f"adapter{i}", i + 1, str(write_random_adapter(model_dir, Path(tmp) / f"a{i}",
                                                                             args.lora_rank, i)))
                    for i in range(args.lora_adapters)]
        return _profile(args, engine, config, batch_sizes, adapters)


def _profile(args, engine: dict, config: dict, batch_sizes: list[int], adapters: list[LoRARequest]) -> int:
    with LLM(args.model, **engine) as llm:
        graphs = llm.engine.info.cuda_graphs
        print(f"{Path(llm.engine.info.model_dir).name} on {llm.engine.info.device} "
              f"({llm.engine.info.dtype}), CUDA graphs: {graphs}", flush=True)
        figures = {"cuda_graphs": graphs, "batches": {}}
        for batch in batch_sizes:  # the JSON after each batch size: a run cut short keeps them
            figures["batches"][str(batch)] = profile_batch(llm, batch, args.input_len, args.output_len,
                                                           args.top, adapters)
            if args.out:
                write_json_atomic(Path(args.out), build_result("profile_decode", config, figures))
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
