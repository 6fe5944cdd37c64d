"""Compare a quantised model with the model it was made from: size on disk and perplexity.

Perplexity runs in a background process (`kvdeck.app.jobs.background`, the worker in
`workers.py`): the original through transformers, the AWQ checkpoint through kvdeck's INT4
layers (quant.hf_int4), both on the same token windows of the same text.

The text is held out: the model's own `heldout.txt` where it ships one, or a file the
user chooses; never the calibration text, on which AWQ fitted its scales and clipping
(perplexity there flatters the quantised model).
"""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.jobs.background import BackgroundJob, start_background
from kvdeck.app.store.local_models import LocalModel
from kvdeck.assets import calibration_text
from kvdeck.engine.types.config import DEVICES

HELDOUT_FILE = "heldout.txt"

WORKER = "kvdeck.app.jobs.workers:compare_worker"  # named: the worker loads torch, this does not


@dataclass(slots=True)
class Comparison:
    original: str
    quantized: str
    original_bytes: int
    quantized_bytes: int
    original_ppl: float
    quantized_ppl: float
    num_tokens: int  # predicted tokens per model
    text_file: str

    @property
    def size_ratio(self) -> float:
        return self.original_bytes / self.quantized_bytes if self.quantized_bytes else 0.0

    def summary(self) -> str:
        delta = 100 * (self.quantized_ppl / self.original_ppl - 1)
        return (
            f"{self.quantized}: {self.size_ratio:.1f}x smaller; perplexity {self.quantized_ppl:.3f}"
            f" vs {self.original_ppl:.3f} ({delta:+.1f}%) on {self.num_tokens} tokens of"
            f" {Path(self.text_file).name}"
        )


@dataclass(frozen=True, slots=True)
class CompareProgress:
    fraction: float  # 0..1 over both models' windows
    message: str


def heldout_text_for(original: LocalModel, quantized: LocalModel) -> Path | None:
    """The held-out text shipped with either model (the bundled demo model has one)."""
    for model in (original, quantized):
        candidate = Path(model.path) / HELDOUT_FILE
        if candidate.is_file():
            return candidate
    return None


def check_eval_text(path: str | Path, calibration: str | None = None) -> str | None:
    """Why `path` will not do as evaluation text, or None: it must exist, hold text, and
    not be the calibration text (kvdeck's default, or the one the model was made with)."""
    file = Path(path).expanduser()
    if not file.is_file():
        return f"{path}: no such file"
    if file.stat().st_size < 100:
        return f"{path}: too short to measure a perplexity on"
    calibration_files = [calibration_text(), *([Path(calibration)] if calibration else [])]
    digest = _digest(file)
    if any(c.is_file() and _digest(c) == digest for c in calibration_files):
        return (f"{file.name} is the calibration text the model was quantised with: its "
                "perplexity there flatters the quantised model. Choose held-out text.")
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(slots=True)
class CompareJob:
    background: BackgroundJob | None = None
    result: Comparison | None = None

    def wait(self, timeout: float | None = None) -> Comparison | None:
        assert self.background is not None
        self.background.wait_or_raise(timeout, "perplexity comparison")
        return self.result

    def cancel(self) -> None:
        assert self.background is not None
        self.background.cancel()


def start_compare(
    original: LocalModel,
    quantized: LocalModel,
    text_file: str | None = None,
    seq_len: int = 256,
    max_windows: int = 16,
    on_message: Callable[[str], None] | None = None,
    on_end: Callable[[CompareJob], None] | None = None,
    num_threads: int | None = None,
    device: str = "auto",
    on_progress: Callable[[CompareProgress], None] | None = None,
) -> CompareJob:
    """Measure both models' perplexity on `text_file` (default: the models' held-out text;
    ValueError when there is none, or when the file is the calibration text)."""
    if quantized.quantization is None or not quantized.quantization.startswith("awq"):
        raise ValueError(f"{quantized.name} is not an AWQ model")
    if seq_len < 2 or max_windows < 1:
        raise ValueError(f"seq_len must be >= 2 and max_windows >= 1, got {seq_len}, {max_windows}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if text_file is None:
        heldout = heldout_text_for(original, quantized)
        if heldout is None:
            raise ValueError(f"{original.name} ships no {HELDOUT_FILE}: choose a text file the "
                             "model was not quantised on")
        text_file = str(heldout)
    problem = check_eval_text(text_file, quantized.calibration_file)
    if problem:
        raise ValueError(problem)
    job = CompareJob()
    spec = {"original": str(original.path), "quantized": str(quantized.path),
            "text_file": text_file, "seq_len": seq_len, "max_windows": max_windows,
            "num_threads": num_threads, "device": device}  # fmt: skip

    def success(values: object) -> None:
        original_ppl, quantized_ppl, num_tokens = values  # type: ignore[misc]
        job.result = Comparison(original.name, quantized.name, original.size_bytes,
                                quantized.size_bytes, original_ppl, quantized_ppl, num_tokens,
                                text_file)  # fmt: skip

    def message(payload: object) -> None:
        fraction, text = payload if isinstance(payload, tuple) else (0.0, payload)
        if on_progress is not None:
            on_progress(CompareProgress(float(fraction), str(text)))
        if on_message is not None:
            on_message(str(text))

    job.background = start_background(
        WORKER, spec, None, on_message=message, on_success=success,
        on_end=lambda _bg: on_end(job) if on_end else None,
    )  # fmt: skip
    return job
