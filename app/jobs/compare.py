"""Compare a quantised model with the model it was made from: size on disk and perplexity.

Perplexity runs in a background process (`kvdeck.app.jobs.background`, the worker in
`workers.py`): the original through transformers, the AWQ checkpoint through kvdeck's INT4
layers (quant.hf_int4), both on the same token windows of the same text.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.jobs.background import BackgroundJob, start_background
from kvdeck.app.store.local_models import LocalModel
from kvdeck.assets import calibration_text
from kvdeck.engine.types.config import DEVICES

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
) -> CompareJob:
    """Measure both models' perplexity on `text_file` (default: the calibration text)."""
    if quantized.quantization is None or not quantized.quantization.startswith("awq"):
        raise ValueError(f"{quantized.name} is not an AWQ model")
    if seq_len < 2 or max_windows < 1:
        raise ValueError(f"seq_len must be >= 2 and max_windows >= 1, got {seq_len}, {max_windows}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if text_file is None:
        text_file = str(calibration_text())
    if not Path(text_file).is_file():
        raise ValueError(f"text file {text_file!r} does not exist")
    job = CompareJob()
    spec = {"original": str(original.path), "quantized": str(quantized.path),
            "text_file": text_file, "seq_len": seq_len, "max_windows": max_windows,
            "num_threads": num_threads, "device": device}  # fmt: skip

    def success(values: object) -> None:
        original_ppl, quantized_ppl, num_tokens = values  # type: ignore[misc]
        job.result = Comparison(original.name, quantized.name, original.size_bytes,
                                quantized.size_bytes, original_ppl, quantized_ppl, num_tokens,
                                text_file)  # fmt: skip

    job.background = start_background(
        WORKER, spec, None,
        on_message=lambda m: on_message(str(m)) if on_message else None,
        on_success=success,
        on_end=lambda _bg: on_end(job) if on_end else None,
    )  # fmt: skip
    return job
