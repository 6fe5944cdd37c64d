"""The timed probe behind the quantise dialog's estimate (run in a spawned process, as the
quantise job is: `kvdeck.app.jobs.workers:probe_worker`).

It runs the quantiser's own code on this machine, on a model cut to its first decoder layer:
the model's config and the first layer's weights (with the embeddings) are loaded as the job
loads the whole model, RTN packs that layer (quant.awq_quantizer.quantize_rtn), AWQ quantises it
(quant.awq_quantizer.quantize_awq) with the job's settings and calibration set, and the one-layer
checkpoint is written as the job writes its own. So the probe does one layer of the job's own
work: about 1/layers of it.

Why the whole calibration set rather than a few sequences scaled up: the scale search scores 16
sequences whatever the set (AWQSettings.search_samples), but besides the recording pass the
statistics, the folds of the scales into the recorded inputs and the clip search's token
sample all walk inputs the size of the set, and scaling only the recording pass from 16
sequences came out about 30% short of the real layers' time on SmolLM2 (the clip search alone
ran 25x slower on a 16-sequence set's stride than on a 4-sequence one's). Hooks on the layer
time the recording pass's forwards for the record (`awq_record_s`).
kvdeck.app.jobs.quantize_estimate turns the figures into minutes.
"""

import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kvdeck.quant.awq_pipeline import checkpoint_tensors, estimated_checkpoint_bytes, pick_device
from kvdeck.quant.awq_quantizer import (
    AWQSettings,
    QuantizeStep,
    check_group_divisibility,
    check_supported,
    default_group_size,
    quantize_awq,
    quantize_rtn,
)
from kvdeck.quant.calibration import load_calibration_ids
from kvdeck.quant.checkpoint import write_awq_checkpoint

Emit = Callable[[tuple], None]


def probe_quantize_time(source: str, scratch: str, *, group_size: int | None = None,
                        calib_file: str | None = None, num_samples: int = 64, seq_len: int = 512,
                        device: str = "auto", emit: Emit | None = None) -> dict:
    """The figures (seconds, counts) the estimate is worked out from. `emit` hears
    ("measured", figures so far) once RTN's are in, and ("step", what) during AWQ's layer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    started = time.monotonic()
    model_dir = Path(source)
    config = AutoConfig.from_pretrained(model_dir)
    check_supported(config)
    group_size = group_size or default_group_size(config)
    check_group_divisibility(config, group_size)
    torch_device = pick_device(device)
    dtype = torch.float16 if torch_device.type == "cuda" else torch.float32  # as the job
    figures: dict = {"layers": int(config.num_hidden_layers), "group_size": group_size,
                     "device": torch_device.type}

    clock = time.monotonic()
    hf_logging.set_verbosity_error()  # the layers left out are "unexpected" weights: expected
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, num_hidden_layers=1).eval()
    figures["load_one_layer_s"] = time.monotonic() - clock
    figures["one_layer_params"] = sum(p.numel() for p in model.parameters())
    figures["params"] = _checkpoint_params(model_dir, figures["one_layer_params"], config)

    # Twice: the first call also pays what a job pays once (the kernels' first use).
    clock = time.monotonic()
    quantize_rtn(model, group_size)
    figures["rtn_first_layer_s"] = time.monotonic() - clock
    clock = time.monotonic()
    quantize_rtn(model, group_size)
    figures["rtn_layer_s"] = time.monotonic() - clock
    figures["worker_s"] = time.monotonic() - started
    if emit is not None:
        emit(("measured", dict(figures)))

    clock = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    calibration = load_calibration_ids(tokenizer, calib_file, num_samples, seq_len)
    figures["tokenize_s"] = time.monotonic() - clock
    settings = AWQSettings(group_size=group_size)
    figures["calibration_samples"] = int(calibration.shape[0])
    recording = _LayerTimer(model.model.layers[0])

    def step(s: QuantizeStep) -> None:
        if emit is not None:
            emit(("step", s.what.replace("layer 1/1: ", "")))

    clock = time.monotonic()
    try:
        packed = quantize_awq(model, calibration, settings, torch_device, on_step=step)
    finally:
        recording.remove()
    figures["awq_layer_s"] = time.monotonic() - clock
    figures["awq_record_s"] = recording.seconds

    clock = time.monotonic()
    with tempfile.TemporaryDirectory(dir=scratch) as out:
        config_dict = json.loads((model_dir / "config.json").read_text())
        config_dict["num_hidden_layers"] = 1
        write_awq_checkpoint(Path(out) / "probe", checkpoint_tensors(model, packed), config_dict, model_dir,
                             group_size)
    figures["write_one_layer_s"] = time.monotonic() - clock
    one_layer = AutoConfig.from_pretrained(model_dir, num_hidden_layers=1)
    figures["checkpoint_bytes"] = estimated_checkpoint_bytes(config)
    figures["one_layer_checkpoint_bytes"] = estimated_checkpoint_bytes(one_layer)
    figures["worker_s"] = time.monotonic() - started
    return figures


class _LayerTimer:
    """Seconds spent in a module's own forwards (the recording pass calls the decoder layer
    whole; the searches call its attention and MLP, on a copy)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds = 0.0
        self._start = 0.0
        self._handles = [module.register_forward_pre_hook(self._before),
                         module.register_forward_hook(self._after)]

    def _before(self, module, args) -> None:
        self._start = time.monotonic()

    def _after(self, module, args, output) -> None:
        self.seconds += time.monotonic() - self._start

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _checkpoint_params(model_dir: Path, one_layer_params: int, config) -> int:
    """The whole model's parameters: from its safetensors headers, else the first layer's
    count times the layers (the embeddings counted once more per layer: an overestimate)."""
    from kvdeck.app.store.inspect import describe_model

    try:
        return describe_model(model_dir).num_params
    except ValueError:
        return one_layer_params * int(config.num_hidden_layers)
