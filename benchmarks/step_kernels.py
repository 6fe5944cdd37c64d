"""What the GPU ran during a few engine steps: every kernel, copy and fill torch.profiler's
trace recorded (those replayed from CUDA graphs included: the trace keeps each graph node's
kernel), summed by kind and by name, per step, beside the steps' wall time.

A target figure (e2e decode, the multi-LoRA step) says how long a step took; this says where
it went: `busy_ms_per_step` is the time some kernel or copy was running (the union of their
intervals, so a side stream's overlap is counted once), `idle_ms_per_step` the rest of the
wall time (host work the device waited for, launch gaps), `by_kind` the device time per
kind (w4a16, gemm, lora, attention, ...) with its launches per step.

    from step_kernels import profile_steps
    with decoding(llm, prompts, max_tokens=64):
        figures = profile_steps(llm.engine.step, steps=16)

Only CUDA activity is recorded (no host operators): the profiled steps' wall time stays
close to an unprofiled step's. On a machine without CUDA nothing is recorded and the
figures say so (`kernels_per_step` 0, `note`).
"""

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from kvdeck import LLM, SamplingParams

# (kind, substrings of a lowercased kernel name), first match wins: kvdeck's Triton kernels by
# their function names (kernels/triton), cuBLAS / CUTLASS GEMMs by theirs, then torch's own.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("w4a16", ("w4a16", "marlin", "awq_dequantize")),
    ("int8_head", ("int8_head",)),
    ("lora", ("lora",)),
    ("attention", ("attention", "merge_segments", "flash", "fmha")),
    ("kv_write", ("write_kv",)),
    ("norm_rope", ("norm", "rope", "rotary")),
    ("activation", ("act_and_mul", "silu", "gelu")),
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "wgmma", "splitkreduce")),
    ("sampling", ("argmax", "topk", "sort", "softmax", "multinomial", "reduce", "scan", "cumsum")),
    ("elementwise", ("elementwise", "vectorized", "index", "gather", "scatter", "embedding", "catarray")),
)
COPY_KINDS = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
TRACE_CATEGORIES = ("kernel", *COPY_KINDS)


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    name: str
    kind: str
    start_us: float
    duration_us: float


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KINDS if any(mark in lowered for mark in marks)), "other")


def device_events(trace: dict) -> list[DeviceEvent]:
    """The kernels, copies and fills of a chrome trace (torch.profiler's export)."""
    events = []
    for event in trace.get("traceEvents", ()):
        category = event.get("cat")
        if category not in TRACE_CATEGORIES or event.get("ph") != "X":
            continue
        name = str(event.get("name", ""))
        kind = COPY_KINDS.get(category) or kernel_kind(name)
        events.append(DeviceEvent(name, kind, float(event["ts"]), float(event.get("dur", 0.0))))
    return events


def busy_us(events: list[DeviceEvent]) -> float:
    """Microseconds at least one event was running: overlapping intervals counted once."""
    total, end = 0.0, None
    for event in sorted(events, key=lambda e: e.start_us):
        stop = event.start_us + event.duration_us
        if end is None or event.start_us >= end:
            total += event.duration_us
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def breakdown(events: list[DeviceEvent], steps: int, wall_s: float, top: int = 12) -> dict:
    """Per-step figures of `steps` steps that took `wall_s` in all."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    wall_ms = 1e3 * wall_s / steps
    figures: dict = {"steps": steps, "wall_ms_per_step": wall_ms, "kernels_per_step": len(events) / steps}
    if not events:
        figures["note"] = "no device kernels recorded (no CUDA activity in the profile)"
        return figures
    busy_ms = busy_us(events) / 1e3 / steps
    by_kind: dict[str, dict] = {}
    by_name: dict[str, list] = {}  # name -> [kind, total us, launches]
    for event in events:
        kind = by_kind.setdefault(event.kind, {"ms_per_step": 0.0, "launches_per_step": 0.0})
        kind["ms_per_step"] += event.duration_us / 1e3 / steps
        kind["launches_per_step"] += 1 / steps
        named = by_name.setdefault(event.name, [event.kind, 0.0, 0])
        named[1] += event.duration_us
        named[2] += 1
    names = sorted(by_name.items(), key=lambda item: item[1][1], reverse=True)[:top]
    figures.update(
        device_ms_per_step=sum(e.duration_us for e in events) / 1e3 / steps,
        busy_ms_per_step=busy_ms,
        idle_ms_per_step=max(0.0, wall_ms - busy_ms),
        busy_fraction=busy_ms / wall_ms if wall_ms > 0 else None,
        by_kind=dict(sorted(by_kind.items(), key=lambda item: item[1]["ms_per_step"], reverse=True)),
        top=[{"name": name[:160], "kind": kind, "ms_per_step": total / 1e3 / steps,
              "launches_per_step": count / steps, "mean_us": total / count}
             for name, (kind, total, count) in names],
    )
    return figures


def profile_steps(step: Callable[[], object], steps: int, top: int = 12) -> dict:
    """Run `step` `steps` times under torch.profiler (CUDA activity only) and break the device
    time down (`breakdown`); the device is synchronised before and after."""
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CUDA] if cuda else [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profiler:
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    return profiler_breakdown(profiler, steps, wall, top)


def profiler_breakdown(profiler: torch.profiler.profile, steps: int, wall_s: float, top: int = 12) -> dict:
    """`breakdown` of a finished torch.profiler session (its chrome trace, read back)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "trace.json"
        profiler.export_chrome_trace(str(trace_path))
        trace = json.loads(trace_path.read_text())
    return breakdown(device_events(trace), steps, wall_s, top)


@contextmanager
def decoding(llm: LLM, prompts: list[list[int]], max_tokens: int,
             loras: list | None = None) -> Iterator[list]:
    """A batch in the decode phase: its requests added (greedy, `max_tokens` each, request i
    under loras[i]), the engine stepped until every one has its first token; the block's
    steps are then decode steps. Its request ids are yielded, and aborted after the block,
    with the prefix cache emptied so the next batch prefills alike."""
    engine, core = llm.engine, llm.engine.core
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    loras = loras or [None] * len(prompts)
    ids = [engine.add_request(None, prompt, params, lora_request=lora)
           for prompt, lora in zip(prompts, loras)]
    try:
        while any(not request.output_token_ids for request in core.requests.values()):
            engine.step()
        yield ids
    finally:
        engine.abort_request(ids)
        engine.reset_prefix_cache()


def profile_steps_or_error(step: Callable[[], object], steps: int, top: int = 12) -> dict:
    """`profile_steps`, or {"error": ...} when the profiler (or a step) fails: a diagnosis
    never costs the figure it rides beside."""
    try:
        return profile_steps(step, steps, top)
    except Exception as error:  # noqa: BLE001 - recorded, the benchmark goes on
        return {"error": f"{type(error).__name__}: {error}"[:2000]}


def summary_line(figures: dict) -> str:
    """One line for a log: wall, busy and the four largest kinds, ms a step (launches)."""
    if "error" in figures:
        return f"not profiled: {figures['error'][:300]}"
    if "busy_ms_per_step" not in figures:
        return f"{figures['wall_ms_per_step']:.3f} ms a step; {figures.get('note', '')}"
    kinds = ", ".join(f"{kind} {row['ms_per_step']:.3f} ({row['launches_per_step']:.0f})"
                      for kind, row in list(figures["by_kind"].items())[:4])
    return (f"{figures['wall_ms_per_step']:.3f} ms a step, device busy {figures['busy_ms_per_step']:.3f}, "
            f"{figures['kernels_per_step']:.0f} kernels; {kinds}")
