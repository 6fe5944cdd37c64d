"""Import a GGUF file into kvdeck's store as an ordinary safetensors model folder.

The metadata becomes config.json and the tokenizer files (config.py), each tensor is
dequantised and written in the chosen dtype (tensors.py), streamed into safetensors
shards (app/safetensors_stream.py). Everything is written in a staging folder inside the
store and renamed into place only when complete, then registered; a failure, a cancel or a
Ctrl-C removes the staging folder, so nothing half-made is ever listed.
"""

import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.jobs.quantize import remove_orphaned_staging
from kvdeck.app.store import paths, registry
from kvdeck.app.store.gguf.header import (
    KVDECK_ARCHITECTURES,
    GGUFImportError,
    check_magic,
    file_type_name,
    unsupported_architecture_error,
)
from kvdeck.app.store.local_models import LocalModel, find_model

DTYPES = ("bfloat16", "float16", "float32")
_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
REPORT_INTERVAL_S = 0.05  # progress callbacks during the tensors, at most this often
_OWNER_FILE = "owner.pid"  # quantise jobs' convention, so remove_orphaned_staging() knows the owner

__all__ = ["DTYPES", "GGUFImportError", "ImportCancelled", "ImportProgress", "import_gguf", "default_name"]


class ImportCancelled(Exception):
    """The import was cancelled; nothing was kept."""


@dataclass(slots=True)
class ImportProgress:
    phase: str  # reading | tokenizer | tensors | done
    tensors_done: int = 0
    tensors_total: int = 0
    bytes_done: int = 0  # GGUF bytes dequantised so far
    bytes_total: int = 0
    current: str | None = None  # the GGUF tensor being dequantised

    @property
    def fraction(self) -> float:
        if self.phase == "done":
            return 1.0
        return self.bytes_done / self.bytes_total if self.bytes_total else 0.0


def default_name(gguf_path: Path) -> str:
    """A store name from the file name."""
    stem = gguf_path.name.removesuffix(".gguf")
    name = re.sub(r"[^\w.\-]+", "-", stem).strip("-.")
    return name or "gguf-model"


def import_gguf(
    gguf_path: str | Path,
    name: str | None = None,
    *,
    dtype: str = "bfloat16",
    on_progress: Callable[[ImportProgress], None] | None = None,
    cancel: threading.Event | None = None,
    origin: str | None = None,
) -> LocalModel:
    """Dequantise `gguf_path` into the store as `name`; returns the listed model.

    Raises GGUFImportError (bad file, unsupported architecture or tensor type, name taken),
    ImportCancelled, or OSError (disk full...). Nothing is left behind on any of them.
    """
    path = Path(gguf_path).expanduser().resolve()
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    name = name or default_name(path)
    _check_name(name)
    check_magic(path)
    remove_orphaned_staging()  # imports and quantise jobs whose process was killed outright
    report = _Reporter(on_progress, cancel)
    job_dir = paths.staging_dir() / f"import-{uuid.uuid4().hex[:12]}"
    job_dir.mkdir(parents=True)
    try:
        (job_dir / _OWNER_FILE).write_text(str(os.getpid()))
        staged, record = _convert(path, job_dir / "model", dtype, report)
        _check_name(name)  # again: another import may have taken it meanwhile
        target = paths.store_dir() / name
        os.rename(staged, target)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    shutil.rmtree(job_dir, ignore_errors=True)
    registry.mark_verified(
        registry.store_key(name),
        {**record, "method": "gguf-import", "origin": origin or str(path), "gguf_file": str(path),
         "path": str(target), "dtype": dtype},
    )  # fmt: skip
    report(ImportProgress("done", record["num_tensors"], record["num_tensors"]))
    model = find_model(name)
    if model is None:
        raise GGUFImportError(f"{name}: the imported model disappeared before it was listed")
    return model


def _convert(path: Path, out_dir: Path, dtype_name: str, report: "_Reporter") -> tuple[Path, dict]:
    import torch
    from gguf import GGUFReader

    from kvdeck.app.store.gguf import tensors as gguf_tensors
    from kvdeck.app.store.gguf.config import load_hf_config, write_model_files
    from kvdeck.app.store.inspect import describe_model
    from kvdeck.app.store.safetensors_stream import DEFAULT_SHARD_BYTES, ShardPlan, ShardWriter

    report(ImportProgress("reading"))
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as exc:
        raise GGUFImportError(f"{path.name}: truncated or corrupt GGUF ({exc})") from None
    gguf_tensors.check_complete(reader, path)
    architecture = str(reader.fields["general.architecture"].contents())
    if architecture not in KVDECK_ARCHITECTURES:
        raise unsupported_architecture_error(path, architecture)
    split = reader.fields.get("split.count")
    if split is not None and int(split.contents()) > 1:
        raise GGUFImportError(f"{path.name}: one of {split.contents()} parts of a split GGUF;"
                              " merge them first (llama.cpp's gguf-split --merge)")
    gguf_tensors.check_tensor_types(reader, path)
    config = load_hf_config(path, reader, dtype_name)
    processor = gguf_tensors.tensor_processor(architecture, config)
    jobs = gguf_tensors.plan_tensors(reader, config, architecture, path)
    dtype = getattr(torch, dtype_name)
    plan = ShardPlan.make(gguf_tensors.specs(jobs), dtype, DEFAULT_SHARD_BYTES)
    _check_disk(out_dir.parent, plan.total_bytes)

    out_dir.mkdir()
    report(ImportProgress("tokenizer", 0, len(jobs), 0, sum(j.nbytes for j in jobs)))
    write_model_files(out_dir, path, reader, config)
    progress = ImportProgress("tensors", 0, len(jobs), 0, sum(j.nbytes for j in jobs))
    by_name = {job.hf_name: job for job in jobs}
    for index, shard in enumerate(plan.shards):
        with ShardWriter(out_dir / plan.filename(index), shard, dtype) as writer:
            for spec in shard:
                job = by_name[spec.name]
                progress.current = job.gguf_name
                report(progress)
                for rows in gguf_tensors.dequantised_rows(job, processor, dtype):
                    writer.write(spec.name, rows)
                    report.check_cancel()
                progress.tensors_done += 1
                progress.bytes_done += job.nbytes
    plan.write_index(out_dir)
    progress.current = None
    report(progress)
    described = describe_model(out_dir)  # the same checks the store applies before listing
    file_type = reader.fields.get("general.file_type")
    record = {
        "architecture": described.architecture,
        "gguf_architecture": architecture,
        "gguf_quantization": file_type_name(file_type.contents() if file_type else None),
        "gguf_tensor_types": sorted({t.tensor_type.name for t in reader.tensors}),
        "num_tensors": len(jobs),
    }
    return out_dir, record


@dataclass(slots=True)
class _Reporter:
    on_progress: Callable[[ImportProgress], None] | None
    cancel: threading.Event | None
    _last: float = 0.0

    def __call__(self, progress: ImportProgress) -> None:
        if progress.phase != "done":  # once registered, the model is kept: too late to cancel
            self.check_cancel()
        now = time.monotonic()
        due = now - self._last >= REPORT_INTERVAL_S or progress.phase != "tensors"
        if self.on_progress is not None and (due or progress.tensors_done == progress.tensors_total):
            self._last = now
            self.on_progress(progress)

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise ImportCancelled("import cancelled; nothing was kept")


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise GGUFImportError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    if (paths.store_dir() / name).exists() or find_model(name) is not None:
        raise GGUFImportError(f"the name {name!r} is already taken in the store; choose another with --name")


def _check_disk(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise GGUFImportError(
            f"not enough disk space in {folder}: about {needed / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free"
        )
