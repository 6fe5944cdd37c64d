"""GGUF models already on disk in other tools' stores: Ollama's and LM Studio's.

Ollama keeps OCI-style manifests at `manifests/<host>/<namespace>/<model>/<tag>` (JSON whose
`layers[]` name blobs by digest) and the blobs at `blobs/sha256-<hex>`, under
`$OLLAMA_MODELS` or `~/.ollama/models`; the layer with media type
`application/vnd.ollama.image.model` is the GGUF. LM Studio keeps plain `.gguf` files in
`<publisher>/<repo>/` folders under `~/.lmstudio/models` (older: `~/.cache/lm-studio/models`).
Nothing here writes to those stores; `kvdeck import` copies a model out of them.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store import registry
from kvdeck.app.store.gguf.header import GGUFImportError, read_gguf_summary
from kvdeck.app.store.gguf.importer import default_name

OLLAMA_PREFIX = "ollama:"
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
OLLAMA_HOST, OLLAMA_NAMESPACE, OLLAMA_TAG = "registry.ollama.ai", "library", "latest"
_LMSTUDIO_MAX_DEPTH = 4  # models/<publisher>/<repo>/<file>.gguf, with room for one more level


@dataclass(slots=True)
class ImportableGGUF:
    ref: str  # what `kvdeck import` takes: "ollama:NAME:TAG" or the file's path
    name: str  # the store name an import picks by default
    source: str  # "ollama" | "lmstudio"
    path: Path  # the GGUF file (an Ollama blob)
    architecture: str
    quantization: str
    size_bytes: int
    problem: str | None = None  # why an import would fail (unreadable, unsupported architecture)
    imported_as: str | None = None  # the store model already made from this file


def ollama_models_dir() -> Path:
    override = os.environ.get("OLLAMA_MODELS")
    return Path(override).expanduser() if override else Path.home() / ".ollama" / "models"


def lmstudio_models_dirs() -> list[Path]:
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def find_importable() -> list[ImportableGGUF]:
    """Every GGUF model in Ollama's and LM Studio's stores, described from its header."""
    imported = _imported_files()
    found = []
    for display, blob in ollama_models():
        found.append(_describe(f"{OLLAMA_PREFIX}{display}", ollama_store_name(display), "ollama", blob))
    for path in lmstudio_files():
        found.append(_describe(str(path), default_name(path), "lmstudio", path))
    for item in found:
        item.imported_as = imported.get(str(item.path.resolve()))
    return found


def resolve_source(source: str) -> tuple[Path, str, str]:
    """(GGUF file, default store name, origin to record) for a path or `ollama:NAME[:TAG]`."""
    if source.startswith(OLLAMA_PREFIX):
        ref = source[len(OLLAMA_PREFIX) :]
        return resolve_ollama(ref), ollama_store_name(ref), source
    path = Path(source).expanduser()
    return path, default_name(path), str(path.resolve())


def ollama_models() -> list[tuple[str, Path]]:
    """(name as Ollama shows it, GGUF blob) for each manifest that has a model layer."""
    manifests = ollama_models_dir() / "manifests"
    if not manifests.is_dir():
        return []
    models = []
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        try:
            blob = _model_blob(manifest)
        except GGUFImportError:
            continue  # not a model (an adapter, a half-pulled manifest): nothing to import
        models.append((_ollama_display(host, namespace, model, tag), blob))
    return models


def resolve_ollama(ref: str) -> Path:
    """The GGUF blob of `NAME[:TAG]` (or `NAMESPACE/NAME`, `HOST/NAMESPACE/NAME`) in Ollama's store."""
    host, namespace, model, tag = parse_ollama_name(ref)
    manifest = ollama_models_dir() / "manifests" / host / namespace / model / tag
    if not manifest.is_file():
        raise GGUFImportError(
            f"ollama:{ref}: no such model in Ollama's store ({ollama_models_dir()}); see `kvdeck models`"
        )
    return _model_blob(manifest)


def parse_ollama_name(ref: str) -> tuple[str, str, str, str]:
    name, _, tag = ref.partition(":")
    parts = name.split("/")
    if not name or len(parts) > 3 or not all(parts) or ".." in parts or "/" in tag:
        raise GGUFImportError(f"ollama:{ref}: not an Ollama model name (like llama3.2:3b)")
    host, namespace = OLLAMA_HOST, OLLAMA_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    return host, namespace, model, tag or OLLAMA_TAG


def ollama_store_name(display: str) -> str:
    """`llama3.2:3b` -> `llama3.2-3b`; the `latest` tag is left out."""
    name, _, tag = display.partition(":")
    base = name.rsplit("/", 1)[-1]
    return base if tag in ("", OLLAMA_TAG) else f"{base}-{tag}"


def lmstudio_files() -> list[Path]:
    files = []
    for root in lmstudio_models_dirs():
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            depth = len(Path(dirpath).relative_to(root).parts)
            if depth >= _LMSTUDIO_MAX_DEPTH:
                dirnames.clear()
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for filename in sorted(filenames):
                # mmproj files are vision projectors that come with a model, not models
                if filename.endswith(".gguf") and not filename.startswith("mmproj"):
                    files.append(Path(dirpath) / filename)
    return sorted(files)


def _model_blob(manifest: Path) -> Path:
    try:
        layers = json.loads(manifest.read_text())["layers"]
        digest = next(x["digest"] for x in layers if x.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE)
    except StopIteration:
        raise GGUFImportError(f"{manifest}: the Ollama manifest has no model layer") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GGUFImportError(f"{manifest}: unreadable Ollama manifest ({exc})") from None
    algorithm, _, hex_digest = str(digest).partition(":")
    if algorithm != "sha256" or not hex_digest.isalnum():
        raise GGUFImportError(f"{manifest}: unexpected blob digest {digest!r}")
    blob = ollama_models_dir() / "blobs" / f"sha256-{hex_digest}"
    if not blob.is_file():
        raise GGUFImportError(f"{manifest}: its model blob {blob.name} is missing (an unfinished pull?)")
    return blob


def _ollama_display(host: str, namespace: str, model: str, tag: str) -> str:
    if host == OLLAMA_HOST and namespace == OLLAMA_NAMESPACE:
        return f"{model}:{tag}"
    if host == OLLAMA_HOST:
        return f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _describe(ref: str, name: str, source: str, path: Path) -> ImportableGGUF:
    item = ImportableGGUF(ref, name, source, path, "?", "?", 0)
    try:
        summary = read_gguf_summary(path)
    except (GGUFImportError, OSError) as exc:
        item.problem = str(exc).removeprefix(f"{path}: ")
        return item
    item.architecture, item.quantization = summary.architecture, summary.quantization
    item.size_bytes = summary.size_bytes
    if summary.split_count > 1:
        item.problem = f"split into {summary.split_count} files, which kvdeck cannot import"
    elif not summary.supported:
        item.problem = f"architecture {summary.architecture} is not supported"
    return item


def _imported_files() -> dict[str, str]:
    """GGUF path -> store name, for imports already made."""
    out = {}
    for key, record in registry.read()["verified"].items():
        if key.startswith("store:") and record.get("gguf_file"):
            out[record["gguf_file"]] = key.removeprefix("store:")
    return out
