"""`kvdeck quantize` end to end: load a local fp model, calibrate, run AWQ, write the checkpoint."""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kvdeck.quant.awq_quantizer import (
    LINEAR_NAMES,
    AWQSettings,
    ProgressCallback,
    QuantizeStep,
    StepCallback,
    check_group_divisibility,
    check_supported,
    default_group_size,
    quantize_awq,
    quantize_rtn,
)
from kvdeck.quant.calibration import load_calibration_ids
from kvdeck.quant.checkpoint import check_output_dir, write_awq_checkpoint


@dataclass(frozen=True, slots=True)
class QuantizeJob:
    source: str  # local model directory (or a hub id already in the local cache)
    out_dir: str | None = None  # default: "<source>-awq" beside the source
    calib_file: str | None = None  # default: assets/calibration/calibration.txt
    # 64 windows of 512 tokens: about what AutoAWQ's 128 calibration texts come to once its
    # loader drops those over 512 tokens and cuts the rest into 512-token blocks
    num_samples: int = 64
    seq_len: int = 512
    group_size: int | None = None  # None: the largest of 128/64/32 that divides the model
    device: str = "auto"  # auto | cuda | cpu
    method: str = "awq"  # awq | rtn (round to nearest: the baseline, no calibration)


def resolve_model_dir(source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{source!r} has no config.json: not a Hugging Face model directory")
        return path.resolve()
    if path.exists() or source.startswith(("/", ".", "~")) or source.count("/") > 1:
        # A path, not a hub id: pulling it would make no sense.
        what = "is a file, not a model directory" if path.exists() else "does not exist"
        raise ValueError(f"model {source!r} is neither a directory nor in the local hub cache: "
                         f"the path {what}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception as exc:
        raise ValueError(
            f"model {source!r} is neither a directory nor in the local hub cache; "
            f"download it first (kvdeck pull {source})"
        ) from exc


def default_out_dir(model_dir: Path, source: str, method: str = "awq") -> Path:
    if Path(source).expanduser().is_dir():
        return model_dir.parent / f"{model_dir.name}-{method}"
    return Path.cwd() / f"{source.rstrip('/').split('/')[-1]}-{method}"


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is available")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    return torch.device(device)


METHODS = ("awq", "rtn")


def run_quantize_job(job: QuantizeJob, progress: ProgressCallback | None = None,
                     on_step: StepCallback | None = None) -> Path:
    """Quantise `job.source` (AWQ, or round-to-nearest) and return the directory written.
    `progress` hears of each finished layer, `on_step` also of the steps before and inside
    the layers."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()

    def stage(what: str, fraction: float = 0.0) -> None:
        if on_step is not None:
            on_step(QuantizeStep(fraction, what, time.monotonic() - start))

    stage("reading the model's config")
    model_dir = resolve_model_dir(job.source)
    out_dir = Path(job.out_dir).expanduser() if job.out_dir else default_out_dir(model_dir,
                                                                                  job.source, job.method)
    out_dir = out_dir.resolve()
    # Everything that can be checked cheaply is checked before the weights are read.
    if job.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {job.method!r}")
    config = AutoConfig.from_pretrained(model_dir)
    check_supported(config)
    group_size = job.group_size if job.group_size is not None else default_group_size(config)
    check_group_divisibility(config, group_size)
    check_output_dir(out_dir, estimated_checkpoint_bytes(config))
    device = pick_device(job.device)
    # fp16 on GPU as AutoAWQ does; fp32 on CPU, where fp16 matmuls are slow and lossy.
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    if job.method == "rtn":
        stage("loading the model")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        stage("rounding the weights to nearest")
        packed = quantize_rtn(model, group_size)
    else:
        stage("tokenising the calibration text")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        calibration = load_calibration_ids(tokenizer, job.calib_file, job.num_samples, job.seq_len)
        stage("loading the model")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        packed = quantize_awq(model, calibration, AWQSettings(group_size=group_size), device,
                              progress, on_step)
    stage("writing the checkpoint", 1.0)
    tensors = checkpoint_tensors(model, packed)
    config_dict = json.loads((model_dir / "config.json").read_text())
    return write_awq_checkpoint(out_dir, tensors, config_dict, model_dir, group_size)


def estimated_checkpoint_bytes(config) -> int:
    """About what the checkpoint will take: int4 linears (+ fp16 scales and packed zeros per
    group of 128, ~0.52 bytes a weight) and fp16 embeddings, head and norms."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    linear = layers * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return int(linear * 0.52 + embeddings * 2 + layers * 4 * hidden)


def checkpoint_tensors(model: torch.nn.Module, packed: dict[str, torch.Tensor]) -> dict:
    """The packed linears plus every other tensor of the model (norms, embeddings, lm_head,
    biases) in fp16, with tied embeddings stored once."""
    quantised = {
        f"model.layers.{i}.{name}.weight"
        for i in range(len(model.model.layers))
        for name in LINEAR_NAMES
    }
    tensors = dict(packed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        if name in quantised or (tied and name == "lm_head.weight"):
            continue
        tensors[name] = tensor.to(torch.float16) if tensor.is_floating_point() else tensor
    return tensors
