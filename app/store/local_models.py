"""The local model store: models in the Hugging Face cache and in kvdeck's own store, the
bundled demo model, and folders the user added (`kvdeck models add DIR`, "Add folder...").

Only complete models are listed. A hub snapshot that kvdeck is still downloading (it is
"pending" in the registry) is never listed, even if it happens to look complete; a snapshot
that some other tool downloaded is listed when its config and every safetensors header
check out. Models in kvdeck's own store appear there only by an atomic rename of a finished
directory (quantise jobs), and are checked the same way.
"""

import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store import paths, registry
from kvdeck.app.store.inspect import (
    SUPPORTED_ARCHITECTURES,
    InvalidModelError,
    describe_model,
)
from kvdeck.assets import demo_model_dir

BUNDLED_NAME = "kvdeck-demo"  # the engine's name for the demo model it runs by default
_FOLDER_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*$")

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "LocalModel",
    "PendingDownload",
    "list_models",
    "find_model",
    "add_folder",
    "describe_folder",
    "hf_snapshot_model",
    "delete_model",
    "pending_downloads",
    "free_disk_bytes",
]


@dataclass(slots=True)
class LocalModel:
    name: str  # hub repo id, the directory name in kvdeck's store, or the name it was added as
    path: Path  # the directory to load (a hub snapshot, a store directory, a folder)
    source: str  # "hf-cache" | "store" | "bundled" | "folder"
    architecture: str
    num_params: int
    dtype: str
    quantization: str | None
    size_bytes: int
    supported: bool
    commit: str | None = None  # the hub commit of a cached snapshot
    verified: bool = False  # kvdeck verified hashes (downloads) or produced it (quantise jobs)
    origin: str | None = None  # for a quantised model: the model it was made from
    origin_path: str | None = None  # ...and where that was, if it is not listed
    calibration_file: str | None = None  # ...and the text it was calibrated on (None: default)
    gguf_quantization: str | None = None  # imported from a GGUF: that file's type (Q4_1, F16...)

    @property
    def quant_label(self) -> str:
        """The Quant column: the checkpoint's quantisation, or for a model imported from a
        quantised GGUF that file's type and what it became ("Q4_1 (imported as bf16)")."""
        if self.quantization:
            return self.quantization
        gguf = self.gguf_quantization
        if gguf and gguf.upper() not in ("F32", "F16", "BF16", "UNKNOWN"):
            short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(self.dtype, self.dtype)
            return f"{gguf} (imported as {short})"
        return "-"

    @property
    def deletable(self) -> bool:
        """Whether `delete_model` removes files (an added folder is only taken off the list;
        the bundled model is part of kvdeck)."""
        return self.source in ("hf-cache", "store")


@dataclass(slots=True)
class PendingDownload:
    repo_id: str
    revision: str
    commit: str
    bytes_on_disk: int  # finished files plus partial ones: what a resume will not fetch again


SOURCE_ORDER = ("bundled", "folder", "hf-cache", "store")


def list_models(bundled: bool = False) -> list[LocalModel]:
    """Complete models kvdeck knows of; `bundled`: the demo model shipped with kvdeck too."""
    data = registry.read()
    models = _hf_cache_models(data) + _store_models(data) + _folder_models(data)
    if bundled:
        models += bundled_models()
    return sorted(models, key=lambda m: (SOURCE_ORDER.index(m.source), m.name.lower()))


def bundled_models() -> list[LocalModel]:
    model = _describe_or_none(demo_model_dir(), BUNDLED_NAME, "bundled")
    if model is None:  # a broken install: nothing to offer
        return []
    model.verified = True
    return [model]


def add_folder(path: str | Path, name: str | None = None) -> LocalModel:
    """Add a model folder from elsewhere on disk to the list (nothing is copied).

    ValueError if it is not a complete model, already listed, or the name is taken."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{path}: no such folder")
    folder = folder.resolve()
    try:
        describe_model(folder)
    except InvalidModelError as exc:
        raise ValueError(f"{folder} is not a complete model: {exc}") from None
    name = name or folder.name
    if not _FOLDER_NAME.match(name):
        raise ValueError(f"name must be letters, digits, '.', '_' or '-', got {name!r}")
    for model in list_models(bundled=True):
        if model.path.resolve() == folder:
            raise ValueError(f"{folder} is already listed as {model.name}")
        if model.name == name:
            raise ValueError(f"a model named {name!r} is already listed; choose another name")
    registry.add_folder(name, str(folder))
    added = find_model(name)
    assert added is not None
    return added


def describe_folder(path: str | Path) -> LocalModel | None:
    """A model folder kvdeck does not list (the origin of a CLI quantisation), or None."""
    folder = Path(path).expanduser()
    return _describe_or_none(folder, folder.name, "folder") if folder.is_dir() else None


def find_model(name_or_path: str) -> LocalModel | None:
    models = list_models(bundled=True)
    for model in models:
        if model.name == name_or_path:
            return model
    candidate = Path(name_or_path).expanduser()
    if candidate.exists():
        resolved = candidate.resolve()
        for model in models:
            if model.path.resolve() == resolved:
                return model
    return None


def hf_snapshot_model(repo_id: str, commit: str) -> LocalModel | None:
    """One snapshot of a hub repo in the cache, described as the list would (None if incomplete)."""
    model = _describe_or_none(paths.repo_cache_folder(repo_id) / "snapshots" / commit, repo_id,
                              "hf-cache")  # fmt: skip
    if model is not None:
        model.commit = commit
        model.verified = registry.hf_key(repo_id, commit) in registry.read()["verified"]
    return model


def pending_downloads() -> list[PendingDownload]:
    pending = []
    for repo_id, record in sorted(registry.read()["pending"].items()):
        pending.append(
            PendingDownload(
                repo_id=repo_id,
                revision=record.get("revision", "main"),
                commit=record.get("commit", ""),
                bytes_on_disk=_bytes_in(paths.repo_cache_folder(repo_id) / "blobs"),
            )
        )
    return pending


def delete_model(name: str) -> Path:
    """Delete a listed model (a whole hub repo from the cache, or a store directory).

    The directory is first renamed aside, so a crash mid-delete never leaves a half-model
    that looks listed. Returns the path that was removed. Raises KeyError if not found.
    An added folder is only taken off the list (its files are the user's); the bundled
    model cannot be deleted (ValueError).
    """
    model = find_model(name)
    if model is not None and model.source == "bundled":
        raise ValueError(f"{model.name} is part of kvdeck and cannot be deleted")
    if model is not None and model.source == "folder":
        registry.remove_folder(model.name)
        return model.path
    if model is not None and model.source == "store":
        target = model.path
        key_prefix = registry.store_key(model.name)
    else:
        repo_id = model.name if model is not None else name
        target = paths.repo_cache_folder(repo_id)
        key_prefix = f"hf:{repo_id}@"
        if not target.exists() and repo_id not in registry.read()["pending"]:
            raise KeyError(f"no local model named {name!r} (see `kvdeck models`)")
    registry.forget(key_prefix)
    if target.exists():
        trash = target.with_name(f".kvdeck-trash-{uuid.uuid4().hex[:8]}-{target.name}")
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return target


def free_disk_bytes(path: Path | None = None) -> int:
    """Free bytes on the filesystem that holds `path` (default: the hub cache)."""
    probe = Path(path) if path is not None else paths.hf_hub_cache()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _hf_cache_models(data: dict) -> list[LocalModel]:
    cache = paths.hf_hub_cache()
    if not cache.is_dir():
        return []
    models = []
    for repo_dir in sorted(cache.glob("models--*")):
        repo_id = repo_dir.name[len("models--") :].replace("--", "/")
        pending_commit = data["pending"].get(repo_id, {}).get("commit")
        for commit in _snapshot_order(repo_dir):
            if commit == pending_commit:
                continue
            model = _describe_or_none(repo_dir / "snapshots" / commit, repo_id, "hf-cache")
            if model is None:
                continue
            model.commit = commit
            model.verified = registry.hf_key(repo_id, commit) in data["verified"]
            models.append(model)
            break  # one entry per repo: the newest complete snapshot
    return models


def _store_models(data: dict) -> list[LocalModel]:
    store = paths.store_dir()
    if not store.is_dir():
        return []
    models = []
    for model_dir in sorted(store.iterdir()):
        if model_dir.name.startswith(".") or not model_dir.is_dir():
            continue
        model = _describe_or_none(model_dir, model_dir.name, "store")
        if model is None:
            continue
        record = data["verified"].get(registry.store_key(model_dir.name))
        model.verified = record is not None
        model.origin = record.get("origin") if record else None
        model.origin_path = record.get("origin_path") if record else None
        model.calibration_file = record.get("calibration_file") if record else None
        model.gguf_quantization = record.get("gguf_quantization") if record else None
        models.append(model)
    return models


def _folder_models(data: dict) -> list[LocalModel]:
    models = []
    for name, record in sorted(data["folders"].items()):
        if not record.get("path"):
            continue
        model = _describe_or_none(Path(record["path"]), name, "folder")
        if model is not None:  # a folder moved or emptied since is left out
            models.append(model)
    return models


def _snapshot_order(repo_dir: Path) -> list[str]:
    """Snapshots to consider: the one `refs/main` points to first, then newest first."""
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return []
    commits = sorted(
        (p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    order = [p.name for p in commits]
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        main = None
    if main in order:
        order.remove(main)
        order.insert(0, main)
    return order


def _describe_or_none(model_dir: Path, name: str, source: str) -> LocalModel | None:
    try:
        d = describe_model(model_dir)
    except InvalidModelError:
        return None
    return LocalModel(
        name=name,
        path=model_dir,
        source=source,
        architecture=d.architecture,
        num_params=d.num_params,
        dtype=d.dtype,
        quantization=d.quantization,
        size_bytes=d.size_bytes,
        supported=d.supported,
    )


def _bytes_in(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    total = 0
    for entry in folder.iterdir():
        try:
            total += entry.stat().st_size
        except OSError:
            continue
    return total
