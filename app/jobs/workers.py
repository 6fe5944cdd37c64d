"""The background jobs' workers, run in spawned processes (`kvdeck.app.jobs.background`).

The job modules name these by string, so the UI process that starts a job never imports
torch or the quantiser.
"""

import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvdeck.quant.awq_pipeline import QuantizeJob as QuantSpec
from kvdeck.quant.awq_pipeline import run_quantize_job
from kvdeck.quant.awq_quantizer import QuantizeProgress, QuantizeStep
from kvdeck.quant.hf_int4 import load_awq_into_transformers
from kvdeck.quant.perplexity import hf_logits_fn, num_windows, perplexity


def _set_threads(spec: dict) -> None:
    if spec.get("num_threads"):
        torch.set_num_threads(spec["num_threads"])


def quantize_worker(spec: dict, emit: Callable[[tuple], None]) -> str:
    """In the worker process: run kvdeck's quantiser (AWQ or RTN), emitting ("layer", done, of,
    elapsed, eta) per finished layer and ("step", fraction, what, elapsed) in between."""
    _set_threads(spec)
    job = QuantSpec(source=spec["source"], out_dir=spec["out_dir"], calib_file=spec["calib_file"],
                    num_samples=spec["num_samples"], seq_len=spec["seq_len"],
                    group_size=spec["group_size"], device=spec["device"],
                    method=spec.get("method", "awq"))  # fmt: skip
    started = time.monotonic()

    def progress(p: QuantizeProgress) -> None:
        emit(("layer", p.layer, p.num_layers, time.monotonic() - started, p.eta_s))

    def step(s: QuantizeStep) -> None:
        emit(("step", s.fraction, s.what, time.monotonic() - started))

    return str(run_quantize_job(job, progress, step))


def probe_worker(spec: dict, emit: Callable[[tuple], None]) -> dict:
    """In the worker process: the quantise dialog's timed probe (quantize_probe.py), emitting
    ("measured", figures so far) and ("step", what) as it goes."""
    from kvdeck.app.jobs.quantize_probe import probe_quantize_time

    _set_threads(spec)
    return probe_quantize_time(spec["source"], spec["scratch"], group_size=spec["group_size"],
                               calib_file=spec["calib_file"], num_samples=spec["num_samples"],
                               seq_len=spec["seq_len"], device=spec["device"], emit=emit)


def compare_worker(spec: dict, emit: Callable[[tuple], None]) -> tuple[float, float, int]:
    """In the worker process: perplexity of both models on the same windows, emitting
    (fraction done, message) as each window is scored."""
    _set_threads(spec)
    tokenizer = AutoTokenizer.from_pretrained(spec["original"])
    text = Path(spec["text_file"]).read_text(encoding="utf-8", errors="replace")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    ids = torch.tensor(ids, dtype=torch.long)
    windows = num_windows(ids.numel(), spec["seq_len"], spec["max_windows"])
    use_cuda = spec["device"] == "cuda" or (spec["device"] == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    # fp16 on GPU as the engine runs it; fp32 on CPU, where fp16 matmuls are slow and lossy.
    dtype = torch.float16 if use_cuda else torch.float32

    def scored(offset: int, what: str) -> Callable[[int], None]:
        def report(done: int) -> None:
            emit(((offset + done) / (2 * windows), f"{what}: window {done} of {windows}"))
        return report

    emit((0.0, "measuring the original"))
    model = AutoModelForCausalLM.from_pretrained(spec["original"], dtype=dtype).to(device).eval()
    base = perplexity(hf_logits_fn(model), ids, spec["seq_len"], spec["max_windows"],
                      on_window=scored(0, "original"))
    del model
    if use_cuda:
        torch.cuda.empty_cache()
    emit((0.5, f"original perplexity {base.perplexity:.3f}; measuring the quantised model"))
    quantized = load_awq_into_transformers(spec["quantized"], device, dtype)
    quant = perplexity(hf_logits_fn(quantized), ids, spec["seq_len"], spec["max_windows"],
                       on_window=scored(windows, "quantised"))
    emit((1.0, "done"))
    return base.perplexity, quant.perplexity, base.num_tokens
