"""Before a quantisation starts: the choices (AWQ or RTN, the group size) and how long each
would take on this machine.

- The group sizes follow the quantiser's rule (quant/awq_quantizer.py: `default_group_size`,
  `check_group_divisibility`), worked out here from config.json, without torch.
- The estimate comes from a timed probe in a spawned process (`quantize_probe.py`, through
  `workers.probe_worker`): the quantiser's own code on the model's first decoder layer, with
  the job's calibration set (about 1/layers of the job). This module scales its figures to
  the whole job: every layer; loading and writing by the weights and the checkpoint's size;
  the process's start-up as the probe's own took.
- The quality trade-off is the one measured on SmolLM2-135M-Instruct
  (benchmarks/results/quality_smollm2_cpu.json).

The UI process imports this module, so it imports no torch.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.app.jobs.background import BackgroundJob, start_background
from kvdeck.app.jobs.quantize import METHOD_NAMES, QuantizeOptions, check_quantizable
from kvdeck.app.store.inspect import read_config
from kvdeck.app.store.local_models import LocalModel

PROBE_WORKER = "kvdeck.app.jobs.workers:probe_worker"
GROUP_SIZES = (128, 64, 32)  # quant/awq_quantizer.py's (AutoAWQ's), largest first
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # quant/awq_quantizer.py's
CONFIRM_ABOVE_S = 120.0  # a job estimated longer than this asks before it starts
# Held-out perplexity over bf16's, SmolLM2-135M-Instruct, group size 64
# (benchmarks/results/quality_smollm2_cpu.json).
PERPLEXITY_OVER_BF16 = {"awq": 1.151, "rtn": 1.367}
METHOD_SUMMARIES = {  # after each method's time in the dialog
    "awq": "better quality (scales fitted on calibration text)",
    "rtn": "lower quality (round to nearest, no calibration)",
}


def _head_dim(config: dict) -> int:
    return int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))


def input_widths(config: dict) -> dict[str, int]:
    """The quantised layers' input widths, each of which a group must divide."""
    return {"hidden_size": int(config["hidden_size"]),
            "intermediate_size": int(config["intermediate_size"]),
            "num_attention_heads * head_dim": int(config["num_attention_heads"]) * _head_dim(config)}


def group_size_problem(config: dict, size: int) -> str | None:
    """Why `size` will not do for this model (as check_group_divisibility says it), or None."""
    for name, width in input_widths(config).items():
        if width % size:
            return f"{name} = {width} is not divisible by {size}"
    kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    outputs = {"num_key_value_heads * head_dim": kv_heads * _head_dim(config),
               "intermediate_size": int(config["intermediate_size"])}
    for name, width in outputs.items():
        if width % 8:
            return f"{name} = {width} is not a multiple of 8 (int4 packing)"
    return None


def group_sizes(config: dict) -> list[int]:
    """The group sizes this model takes, largest (the default) first; [] if none."""
    return [size for size in GROUP_SIZES if group_size_problem(config, size) is None]


def check_config(config: dict) -> None:
    """ValueError unless the quantiser takes this architecture and some group size fits."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"kvdeck quantises {', '.join(SUPPORTED_MODEL_TYPES)} models, not {model_type!r}")
    try:
        sizes = group_sizes(config)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"config.json lacks a layer width ({exc})") from None
    if not sizes:
        widths = ", ".join(f"{name} = {width}" for name, width in input_widths(config).items())
        raise ValueError(f"no INT4 group size in {GROUP_SIZES} divides every layer width ({widths})")


@dataclass(frozen=True, slots=True)
class QuantizeChoices:
    """What the quantise dialog offers for a model."""

    group_sizes: list[int]  # the sizes that fit, largest (the default) first
    note: str = ""  # why the sizes left out do not fit ("" when all do)


def quantize_choices(model: LocalModel) -> QuantizeChoices:
    """The group sizes `model` takes; ValueError, with a reason to show, if kvdeck cannot
    quantise it (already quantised, an architecture the quantiser lacks, an unreadable
    config.json, no group size that fits)."""
    check_quantizable(model)
    try:
        config = read_config(model.path)  # InvalidModelError (a ValueError) names the file
        check_config(config)
    except ValueError as exc:
        raise ValueError(f"{model.name}: {exc}") from None
    sizes = group_sizes(config)
    left_out = [f"{size}: {group_size_problem(config, size)}" for size in GROUP_SIZES if size not in sizes]
    return QuantizeChoices(sizes, f"Not offered: {'; '.join(left_out)}." if left_out else "")


def format_estimate(seconds: float) -> str:
    """"about 8 s", "about 6 min", "about 1 h 40 min"."""
    if seconds < 60:
        return f"about {max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


def quality_note() -> str:
    awq, rtn = (round(100 * (PERPLEXITY_OVER_BF16[m] - 1)) for m in ("awq", "rtn"))
    return (f"Quality on SmolLM2-135M-Instruct: held-out perplexity +{awq}% with AWQ, +{rtn}% with "
            "RTN, over bf16.")


@dataclass(frozen=True, slots=True)
class MethodEstimate:
    method: str
    seconds: float
    how: str  # how it was worked out, in a line

    @property
    def needs_confirmation(self) -> bool:
        return self.seconds > CONFIRM_ABOVE_S


@dataclass(frozen=True, slots=True)
class QuantizeEstimate:
    """Each method's time on this machine; AWQ's is None until its probe is done."""

    rtn: MethodEstimate | None
    awq: MethodEstimate | None
    figures: dict = field(default_factory=dict)  # the probe's, as measured

    def get(self, method: str) -> MethodEstimate | None:
        return self.awq if method == "awq" else self.rtn


def estimate_from_figures(figures: dict, startup_s: float) -> QuantizeEstimate:
    """Scale the probe's figures (quantize_probe.probe_quantize_time) to the whole job.
    `startup_s`: the probe process's start (spawn, imports) before it began measuring."""
    layers = figures["layers"]
    load = figures["load_one_layer_s"] * figures["params"] / max(1, figures["one_layer_params"])
    fixed = startup_s + load
    first_use = max(0.0, figures.get("rtn_first_layer_s", 0.0) - figures["rtn_layer_s"])
    rtn_s = fixed + first_use + layers * figures["rtn_layer_s"]
    write = None
    if "write_one_layer_s" in figures:
        write = figures["write_one_layer_s"] * figures["checkpoint_bytes"] / max(
            1, figures["one_layer_checkpoint_bytes"])
        rtn_s += write
    rtn = MethodEstimate("rtn", rtn_s, f"one layer rounded in {_short(figures['rtn_layer_s'])} here, "
                                       f"x {layers} layers, plus loading, writing and start-up")
    awq = None
    if "awq_layer_s" in figures and write is not None:
        awq_s = fixed + write + figures["tokenize_s"] + layers * figures["awq_layer_s"]
        awq = MethodEstimate("awq", awq_s, f"the first layer's AWQ on {figures['calibration_samples']} "
                                           f"calibration sequences took {_short(figures['awq_layer_s'])} "
                                           f"here, x {layers} layers, plus loading, writing and start-up")
    return QuantizeEstimate(rtn, awq, dict(figures))


def _short(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 0.95 else f"{seconds * 1e3:.0f} ms"


@dataclass(slots=True)
class ProbeJob:
    """A running probe; `cancel()` it (it blocks while the process stops)."""

    background: BackgroundJob | None = None
    started: float = 0.0
    startup_s: float | None = None  # the process's start, known from its first report
    estimate: QuantizeEstimate | None = None

    def cancel(self) -> None:
        if self.background is not None and not self.background.done:
            self.background.cancel()

    def cancel_in_background(self) -> None:
        """For the UI thread: the process is stopped by a thread of its own."""
        threading.Thread(target=self.cancel, daemon=True, name="kvdeck-probe-cancel").start()


def start_probe(model: LocalModel, options: QuantizeOptions | None,
                on_estimate: Callable[[QuantizeEstimate], None],
                on_step: Callable[[str], None] | None = None,
                on_end: Callable[[str | None], None] | None = None,
                group_size: int | None = None) -> ProbeJob:
    """Time the quantiser on `model`'s first layer in a spawned process. `on_estimate` hears
    RTN's estimate, then both; `on_step` what the probe does; `on_end` its error or None (not
    after a cancel). The callbacks run in the job's monitor thread."""
    options = options or QuantizeOptions()
    scratch = Path(tempfile.mkdtemp(prefix="kvdeck-probe-"))
    probe = ProbeJob(started=time.monotonic())

    def figures_in(figures: dict) -> None:
        if probe.startup_s is None:
            probe.startup_s = max(0.0, time.monotonic() - probe.started - figures["worker_s"])
        probe.estimate = estimate_from_figures(figures, probe.startup_s)
        on_estimate(probe.estimate)

    def message(payload: tuple) -> None:
        if payload[0] == "measured":
            figures_in(payload[1])
        elif payload[0] == "step" and on_step is not None:
            on_step(str(payload[1]))

    def ended(job: BackgroundJob) -> None:
        if on_end is not None and not job.cancelled:
            on_end(job.error)

    spec = {"source": str(model.path), "scratch": str(scratch),
            "group_size": group_size or options.group_size, "calib_file": options.calib_file,
            "num_samples": options.num_samples, "seq_len": options.seq_len, "device": options.device,
            "num_threads": options.num_threads}
    probe.background = start_background(PROBE_WORKER, spec, scratch, message,
                                        lambda figures: figures_in(dict(figures)), ended)
    return probe


__all__ = ["CONFIRM_ABOVE_S", "GROUP_SIZES", "METHOD_NAMES", "METHOD_SUMMARIES", "MethodEstimate",
           "ProbeJob", "QuantizeChoices", "QuantizeEstimate", "check_config", "estimate_from_figures",
           "format_estimate", "group_size_problem", "group_sizes", "quality_note", "quantize_choices",
           "start_probe"]
