"""`kvdeck bench throughput`: offline throughput on a synthetic workload, with an
optional Hugging Face `generate` baseline on the same requests in the same run."""

import os
import random
import time
from dataclasses import dataclass

from kvdeck.app.bench.compiles import timed_without_compiles
from kvdeck.engine.api.llm import LLM
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams


@dataclass(slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def parse_range(text: str, name: str) -> tuple[int, int]:
    try:
        low, _, high = text.partition(":")
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"{name} must look like MIN:MAX (e.g. 100:1024), got {text!r}") from None
    if lo <= 0 or hi < lo:
        raise ValueError(f"{name} must satisfy 0 < MIN <= MAX, got {text!r}")
    return lo, hi


def synthetic_requests(num: int, input_len: tuple[int, int], output_len: tuple[int, int],
                       vocab_size: int, seed: int) -> list[BenchRequest]:
    """Random-token prompts, lengths uniform in the ranges (the nano-vllm / vLLM workload)."""
    rng = random.Random(seed)
    return [
        BenchRequest(
            [rng.randrange(vocab_size) for _ in range(rng.randint(*input_len))],
            rng.randint(*output_len),
        )
        for _ in range(num)
    ]


def requests_from_file(path: str, tokenizer, output_len: tuple[int, int], seed: int,
                       num: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    lines = [line.strip() for line in open(path, encoding="utf-8") if line.strip()]
    if not lines:
        raise ValueError(f"prompt file {path} has no prompts")
    return [BenchRequest(tokenizer.encode(lines[i % len(lines)]), rng.randint(*output_len))
            for i in range(num)]


WARMUP_REQUESTS = 4
WARMUP_OUTPUT_LEN = 8


def warmup_requests(requests: list[BenchRequest]) -> list[BenchRequest]:
    """A few short requests run untimed first by both sides, so that one-off costs
    (thread pools, allocator growth, lazy kernels) are not billed to either."""
    return [BenchRequest(r.prompt_token_ids, min(r.output_len, WARMUP_OUTPUT_LEN))
            for r in requests[:WARMUP_REQUESTS]]


def warm_up_kvdeck(llm: LLM, requests: list[BenchRequest]) -> None:
    engine = llm.engine
    _add_requests(engine, warmup_requests(requests), "warmup")
    while engine.has_unfinished_requests():
        engine.step()


def _add_requests(engine, requests: list[BenchRequest], prefix: str) -> None:
    # Greedy, exactly output_len tokens, token ids only (no detokenising), like the baseline;
    # each output brings its new ids (the loop counts them).
    for i, r in enumerate(requests):
        engine.add_request(f"{prefix}-{i}", r.prompt_token_ids,
                           SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                          detokenize=False, output_kind=RequestOutputKind.DELTA))


def median_run(runs: list[dict]) -> dict:
    """The run with the median output tokens/s (the lower middle one for an even count),
    with every run's figure beside it."""
    ordered = sorted(runs, key=lambda run: run["output_tokens_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        chosen["runs_output_tokens_per_s"] = [run["output_tokens_per_s"] for run in runs]
    return chosen


def run_kvdeck(llm: LLM, requests: list[BenchRequest]) -> dict:
    """Run all requests through the engine's step loop, sampling KV figures every step.

    Like nano-vllm's bench and the baseline, token ids only: no detokenising. A run with a
    kernel compile in it is run again (app/bench/compiles.py); a second one is refused.
    """
    figures, discarded = timed_without_compiles(llm, lambda: _run_kvdeck_once(llm, requests),
                                                "bench throughput")
    return {**figures, "kernel_compiles": 0, "runs_discarded_for_compiles": discarded}


def _run_kvdeck_once(llm: LLM, requests: list[BenchRequest]) -> dict:
    engine = llm.engine
    # Nothing from a warm-up or an earlier repeat may be served from the prefix cache.
    engine.reset_prefix_cache()
    stats0 = engine.stats()
    engine.reset_timings()
    started = time.perf_counter()
    _add_requests(engine, requests, "bench")
    peak = {"usage": 0.0, "allocated": 0, "filled": 0, "running": 0}
    output_tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            output_tokens += len(out.delta_token_ids)
        held = engine.occupancy()
        if held.usage >= peak["usage"]:
            # After the step, computed tokens are exactly the filled slots.
            peak = {"usage": held.usage, "allocated": held.allocated_tokens,
                    "filled": held.computed_tokens, "running": held.num_running}
    elapsed = time.perf_counter() - started
    stats = engine.stats()
    timings = engine.step_timings()
    queries = stats.prefix_cache_queries - stats0.prefix_cache_queries
    hits = stats.prefix_cache_hits - stats0.prefix_cache_hits
    contiguous = peak["running"] * engine.max_model_len
    return {
        **_rates(requests, output_tokens, elapsed),
        "peak_kv_usage": peak["usage"],
        "kv_waste_at_peak": 1 - peak["filled"] / peak["allocated"] if peak["allocated"] else 0.0,
        "contiguous_kv_waste_at_peak": 1 - peak["filled"] / contiguous if contiguous else 0.0,
        "preemptions": stats.num_preemptions - stats0.num_preemptions,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "steps": stats.num_steps - stats0.num_steps,
        "step_time_breakdown_s": {
            "schedule": timings.schedule_s, "prepare_inputs": timings.prepare_s,
            "model_and_sampling": timings.model_s, "update_outputs": timings.update_s,
            "frontend": timings.frontend_s,
        },
        "host_overhead_share": timings.host_share,
        # Host work per step: each phase, and their sum (the front-end's included).
        "host_work_per_step_s": _per_step(timings),
        # The caller's loop around the steps (adding requests, reading occupancy).
        "outside_steps_s": elapsed - timings.host_s - timings.model_s,
    }


def _per_step(timings) -> dict:
    steps = max(1, timings.steps)
    return {"schedule": timings.schedule_s / steps, "prepare_inputs": timings.prepare_s / steps,
            "update_outputs": timings.update_s / steps, "frontend": timings.frontend_s / steps,
            "total": timings.host_s / steps}


def run_hf_baseline(model_dir, requests: list[BenchRequest], batch_size: int, device: str,
                    dtype_name: str, dummy: bool = False, repeats: int = 1) -> list[dict]:
    """transformers `generate` on the requests, `repeats` timed passes, in a process of its
    own: a model that ran in the engine's process (or the engine in the baseline's) leaves
    the heap and caches in a state that slows whatever runs next there by up to 20%."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # The engine's CPU memory settings, for fairness: huge pages for big buffers (torch
    # reads this at start-up, so the child must inherit it), glibc's (set in the child).
    previous = os.environ.get("THP_MEM_ALLOC_ENABLE")
    os.environ["THP_MEM_ALLOC_ENABLE"] = "1" if device == "cpu" else (previous or "0")
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_baseline_runs, str(model_dir), requests, batch_size, device,
                               dtype_name, dummy, repeats).result()
    finally:
        if previous is None:
            del os.environ["THP_MEM_ALLOC_ENABLE"]
        else:
            os.environ["THP_MEM_ALLOC_ENABLE"] = previous


def _baseline_runs(model_dir: str, requests: list[BenchRequest], batch_size: int, device: str,
                   dtype_name: str, dummy: bool, repeats: int) -> list[dict]:
    import torch
    import transformers

    from kvdeck.engine.runner.host_memory import keep_freed_buffers_in_process

    if device == "cpu":
        keep_freed_buffers_in_process()
    dtype = getattr(torch, dtype_name)
    if dummy:
        config = transformers.AutoConfig.from_pretrained(model_dir)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None
    _hf_generate(model, warmup_requests(requests), device)
    runs = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        # A static batch runs until its longest request is done; only the tokens each
        # request asked for count as output, as in vLLM's and nano-vllm's comparisons.
        for start in range(0, len(requests), batch_size):
            _hf_generate(model, requests[start : start + batch_size], device)
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        runs.append({**_rates(requests, sum(r.output_len for r in requests), elapsed),
                     "batch_size": batch_size})
    return runs


def _hf_generate(model, batch: list[BenchRequest], device: str) -> None:
    import torch

    width = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, r in enumerate(batch):
        ids[row, width - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
        mask[row, width - len(r.prompt_token_ids) :] = 1
    with torch.inference_mode():
        model.generate(
            ids.to(device), attention_mask=mask.to(device), do_sample=False,
            max_new_tokens=max(r.output_len for r in batch), pad_token_id=0,
        )


def _rates(requests: list[BenchRequest], output_tokens: int, elapsed: float) -> dict:
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    return {
        "elapsed_s": elapsed,
        "requests_per_s": len(requests) / elapsed,
        "output_tokens_per_s": output_tokens / elapsed,
        "total_tokens_per_s": (output_tokens + prompt_tokens) / elapsed,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
    }
