"""Download a model from the Hugging Face hub into the hub cache, resumably, and verify it.

Through `huggingface_hub`'s own client (model info, HEAD metadata, `http_get` with its
Range-resume and retries), into the standard cache layout (`blobs/`, `snapshots/`, `refs/`),
so other tools see the files too. Unlike `hf_hub_download`, a partial file is kept as
`blobs/<etag>.incomplete` across cancels and restarts, so a resume fetches only the rest.

A model is registered only when every file is complete and verified: sha256 against the
hub's LFS metadata (git blob sha1 for small files), config.json parsed, every safetensors
header parsed and consistent with the file's size. Until then it is "pending" in the
registry and the store does not list it.
"""

import contextlib
import errno
import fnmatch
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import filelock
import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock, build_hf_headers

from kvdeck.app.store import paths, registry
from kvdeck.app.store.download_progress import (
    CancelToken,
    DownloadCancelled,
    DownloadProgress,
    FileProgress,
    ProgressTracker,
    tqdm_class_for,
)
from kvdeck.app.store.inspect import SUPPORTED_ARCHITECTURES, InvalidModelError, describe_model
from kvdeck.app.store.local_models import LocalModel, hf_snapshot_model

# Root-level files kvdeck needs; subfolders (e.g. Llama's `original/`) are never fetched.
ALLOW_PATTERNS = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "*.jinja",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$|^[A-Za-z0-9][\w.\-]*$")
_DISK_MARGIN_BYTES = 64 * 1024 * 1024
_HASH_CHUNK = 8 * 1024 * 1024
# http_get reads in chunks of huggingface_hub's DOWNLOAD_CHUNK_SIZE (10 MB): progress,
# cancellation and the resume point advance one chunk at a time, so keep chunks small.
CHUNK_BYTES = 1024 * 1024

__all__ = [
    "ALLOW_PATTERNS",
    "CancelToken",
    "DownloadCancelled",
    "DownloadError",
    "NetworkError",
    "RepoNotFound",
    "GatedRepo",
    "DiskFull",
    "CorruptFile",
    "UnsupportedArchitecture",
    "download_model",
]


class DownloadError(Exception):
    """A download failed; the message is meant for the user."""


class NetworkError(DownloadError):
    pass


class RepoNotFound(DownloadError):
    pass


class GatedRepo(DownloadError):
    pass


class DiskFull(DownloadError):
    pass


class CorruptFile(DownloadError):
    pass


class UnsupportedArchitecture(DownloadError):
    pass


@dataclass(slots=True)
class _RemoteFile:
    name: str
    size: int
    blob_id: str | None  # git sha1 of the file (small files)
    sha256: str | None  # LFS files


def download_model(
    repo_id: str,
    revision: str = "main",
    *,
    on_progress: Callable[[DownloadProgress], None] | None = None,
    cancel: CancelToken | None = None,
    allow_unsupported: bool = False,
) -> LocalModel:
    """Download, verify and register `repo_id`; returns the listed model.

    Raises a DownloadError subclass (NetworkError, RepoNotFound, GatedRepo, DiskFull,
    CorruptFile, UnsupportedArchitecture) or DownloadCancelled; a ValueError for a bad id.
    """
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise ValueError(f"repo id must look like 'org/name', got {repo_id!r}")
    tracker = ProgressTracker(repo_id, on_progress, cancel or CancelToken())
    endpoint, token = paths.hf_endpoint(), paths.hf_token()
    try:
        return _download(repo_id, revision, endpoint, token, tracker, allow_unsupported)
    except (DownloadError, DownloadCancelled):
        raise
    except GatedRepoError as exc:
        raise _gated_error(repo_id, endpoint, token) from exc
    except RepositoryNotFoundError as exc:
        raise RepoNotFound(
            f"{repo_id}: no such model on {endpoint} (404). Check the id; for a private repo set"
            " HF_TOKEN."
        ) from exc
    except RevisionNotFoundError as exc:
        raise RepoNotFound(f"{repo_id}: revision {revision!r} not found") from exc
    except (httpx2.TransportError, LocalEntryNotFoundError) as exc:
        raise NetworkError(f"cannot reach {endpoint} ({exc}); check your network or HF_ENDPOINT") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise NetworkError(f"{endpoint} answered HTTP {status} for {repo_id}: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DiskFull(f"disk full while downloading {repo_id}; free space and resume") from exc
        raise


def _download(
    repo_id: str,
    revision: str,
    endpoint: str,
    token: str | None,
    tracker: ProgressTracker,
    allow_unsupported: bool,
) -> LocalModel:
    if paths.hf_offline():
        raise NetworkError("HF_HUB_OFFLINE is set: downloads are disabled")
    info = HfApi(endpoint=endpoint, token=token or False).model_info(
        repo_id, revision=revision, files_metadata=True
    )
    if info.gated and not token:
        raise _gated_error(repo_id, endpoint, token)
    commit = info.sha
    if not commit:
        raise NetworkError(f"{endpoint} did not say which commit {repo_id}@{revision} is")
    remote = _wanted_files(info.siblings or [], repo_id)
    repo_dir = paths.repo_cache_folder(repo_id)
    snapshot = repo_dir / "snapshots" / commit
    if registry.hf_key(repo_id, commit) in registry.read()["verified"]:
        model = hf_snapshot_model(repo_id, commit)
        if model is not None:
            return model  # already complete and verified
    existed_before = repo_dir.exists()
    registry.mark_pending(repo_id, revision, commit)
    _write_ref(repo_dir, revision, commit)

    entries = [FileProgress(f.name, f.size) for f in remote]
    tracker.set_files(entries)
    session = _Session(repo_id, commit, endpoint, token, repo_dir, tracker)
    config_index = next(i for i, f in enumerate(remote) if f.name == "config.json")
    session.fetch(remote[config_index], entries[config_index])
    try:
        _check_architecture(snapshot, allow_unsupported)
    except UnsupportedArchitecture:
        registry.forget(f"hf:{repo_id}@")
        if not existed_before:
            shutil.rmtree(repo_dir, ignore_errors=True)
        raise
    _check_disk_space(repo_dir, remote, entries)
    for file, entry in zip(remote, entries, strict=True):
        session.fetch(file, entry)

    tracker.set_phase("verifying")
    try:
        described = describe_model(snapshot)
    except InvalidModelError as exc:
        raise CorruptFile(f"{repo_id}: {exc}") from exc
    registry.mark_verified(
        registry.hf_key(repo_id, commit),
        {"repo_id": repo_id, "commit": commit, "revision": revision, "path": str(snapshot),
         "architecture": described.architecture, "files": [f.name for f in remote]},
    )  # fmt: skip
    tracker.set_phase("done")
    model = hf_snapshot_model(repo_id, commit)
    if model is None:  # removed under our feet (a concurrent `kvdeck rm`)
        raise CorruptFile(f"{repo_id}: the downloaded files disappeared before registration")
    return model


@dataclass(slots=True)
class _Session:
    repo_id: str
    commit: str
    endpoint: str
    token: str | None
    repo_dir: Path
    tracker: ProgressTracker

    def fetch(self, file: _RemoteFile, entry: FileProgress) -> None:
        """Make snapshots/<commit>/<name> point at a verified blob, resuming a partial one."""
        pointer = self.repo_dir / "snapshots" / self.commit / file.name
        if entry.state == "done":
            return
        if pointer.exists():
            self.tracker.finish_file(entry)
            return
        url = hf_hub_url(self.repo_id, file.name, revision=self.commit, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, token=self.token or False, endpoint=self.endpoint)
        etag = meta.etag or file.sha256 or file.blob_id
        if not etag or "/" in etag:
            raise CorruptFile(f"{file.name}: the server gave no usable ETag")
        blobs = self.repo_dir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        blob, partial = blobs / etag, blobs / f"{etag}.incomplete"
        # huggingface_hub's own lock for this blob: another kvdeck (or hub client) fetching
        # the same file waits instead of appending to the same partial file.
        lock = paths.hf_hub_cache() / ".locks" / self.repo_dir.name / f"{etag}.lock"
        with _blob_lock(lock, self.tracker.cancel):
            if not blob.exists():
                self._transfer(file, entry, meta.location, url, meta.size or file.size, partial)
                self._verify(file, entry, partial)
                os.replace(partial, blob)
            elif not _hash_matches(blob, file):  # a blob some other tool left: check it too
                blob.unlink()
                raise CorruptFile(
                    f"{file.name}: cached copy failed verification and was removed; retry"
                )
        _link(pointer, blob)
        self.tracker.finish_file(entry)

    def _transfer(
        self, file: _RemoteFile, entry: FileProgress, location: str, url: str, size: int,
        partial: Path,
    ) -> None:  # fmt: skip
        resume = partial.stat().st_size if partial.exists() else 0
        if resume > size:  # not ours, or from another version of the file
            partial.unlink()
            resume = 0
        self.tracker.start_file(entry, resume)
        headers = build_hf_headers(token=self.token or False)
        headers["Accept-Encoding"] = "identity"
        if urlparse(location).netloc != urlparse(url).netloc:
            headers.pop("authorization", None)  # a CDN's signed URL must not get the token
        constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
        with open(partial, "ab") as f:
            http_get(
                location,
                f,
                resume_size=resume,
                headers=headers,
                expected_size=size,
                displayed_filename=file.name,
                tqdm_class=tqdm_class_for(self.tracker, entry),
            )
            f.flush()
            os.fsync(f.fileno())

    def _verify(self, file: _RemoteFile, entry: FileProgress, path: Path) -> None:
        self.tracker.set_phase("verifying", entry)
        if not _hash_matches(path, file):
            path.unlink()
            raise CorruptFile(
                f"{file.name}: content does not match the hub's checksum (corrupt transfer);"
                " the bad copy was deleted, run the download again"
            )
        self.tracker.phase = "downloading"


def _wanted_files(siblings: list, repo_id: str) -> list[_RemoteFile]:
    files = []
    for s in siblings:
        name = s.rfilename
        if "/" in name or not any(fnmatch.fnmatch(name, p) for p in ALLOW_PATTERNS):
            continue
        lfs = s.lfs
        size = s.size if s.size is not None else (lfs.size if lfs else 0)
        sha256 = lfs.sha256 if lfs else None
        files.append(_RemoteFile(name=name, size=int(size or 0), blob_id=s.blob_id, sha256=sha256))
    names = {f.name for f in files}
    if "config.json" not in names:
        raise UnsupportedArchitecture(f"{repo_id}: no config.json; not a transformers model")
    if not any(n.endswith(".safetensors") for n in names):
        raise UnsupportedArchitecture(
            f"{repo_id}: no safetensors weights (kvdeck does not load pickle checkpoints)"
        )
    # Small files first, so the config is checked before gigabytes move.
    return sorted(files, key=lambda f: (f.name.endswith(".safetensors"), f.name))


def _check_architecture(snapshot: Path, allow_unsupported: bool) -> None:
    from kvdeck.app.store.inspect import read_config

    try:
        config = read_config(snapshot)
    except InvalidModelError as exc:
        raise CorruptFile(str(exc)) from exc
    architectures = config.get("architectures") or []
    if allow_unsupported or any(a in SUPPORTED_ARCHITECTURES for a in architectures):
        return
    found = ", ".join(architectures) or config.get("model_type", "unknown")
    raise UnsupportedArchitecture(
        f"architecture {found} is not supported by kvdeck (supported: "
        f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}); nothing was downloaded"
    )


def _check_disk_space(repo_dir: Path, remote: list[_RemoteFile], entries: list[FileProgress]) -> None:
    blobs = repo_dir / "blobs"
    already = sum(p.stat().st_size for p in blobs.glob("*.incomplete")) if blobs.exists() else 0
    needed = sum(f.size for f, e in zip(remote, entries, strict=True) if e.state != "done")
    needed = max(0, needed - already)
    free = shutil.disk_usage(repo_dir).free
    if needed + _DISK_MARGIN_BYTES > free:
        raise DiskFull(
            f"not enough disk space in {repo_dir.parent}: need {needed / 1e9:.2f} GB more,"
            f" {free / 1e9:.2f} GB free"
        )


@contextlib.contextmanager
def _blob_lock(path: Path, cancel: CancelToken) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        cancel.check()  # waiting on another download stays cancellable
        try:
            with WeakFileLock(path, timeout=0.5):
                yield
                return
        except filelock.Timeout:
            continue


def _hash_matches(path: Path, file: _RemoteFile) -> bool:
    if file.sha256:
        digest = hashlib.sha256()
        expected = file.sha256
    elif file.blob_id:
        # A git blob id: sha1 over "blob <size>\0" + content.
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(f"blob {path.stat().st_size}\0".encode())
        expected = file.blob_id
    else:
        return path.stat().st_size == file.size
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == expected


def _link(pointer: Path, blob: Path) -> None:
    """Point the snapshot entry at the blob (relative symlink, as huggingface_hub does), atomically."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    except OSError:  # no symlinks on this filesystem: copy
        shutil.copyfile(blob, tmp)
    os.replace(tmp, pointer)


def _write_ref(repo_dir: Path, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo_dir / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _gated_error(repo_id: str, endpoint: str, token: str | None) -> GatedRepo:
    if token:
        return GatedRepo(
            f"{repo_id} is gated and your token has no access: accept its licence at"
            f" {endpoint}/{repo_id} (401/403)"
        )
    return GatedRepo(
        f"{repo_id} is gated (401): accept its licence at {endpoint}/{repo_id}, then set HF_TOKEN"
        " or run `hf auth login`"
    )
