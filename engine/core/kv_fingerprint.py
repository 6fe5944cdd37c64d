"""The identity of a model's KV blocks on disk: the same tokens give the same K/V only under
the same weights, dtype, KV format, block size and layout, so all of them name the folder the
disk tier reads (`kv_disk_store.py`). Weights are identified by their files' names, sizes and
modification times (hashing gigabytes at every start would cost more than it saves), random
(`load_format="dummy"`) weights by their seed."""

import hashlib
import json
from pathlib import Path

from kvdeck.engine.core.kv_disk_store import LAYOUT_VERSION

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_fingerprint(model_dir: Path, *, dtype: str, kv_format: str, block_size: int,
                      part_sizes: list[int], load_format: str, seed: int,
                      quantization: str | None) -> str:
    """32 hex digits naming the model's KV blocks (see the module's docstring)."""
    model_dir = Path(model_dir).resolve()
    files = []
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and (path.suffix in _WEIGHT_SUFFIXES or path.name == "config.json"):
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
    identity = {
        "layout": LAYOUT_VERSION,
        "model": str(model_dir),
        "files": files,
        "config": _read(model_dir / "config.json"),
        "dtype": dtype,
        "kv_format": kv_format,
        "block_size": block_size,
        "parts": part_sizes,
        "quantization": quantization,
        # Random weights are the same only from the same seed.
        "weights": f"dummy:{seed}" if load_format == "dummy" else load_format,
    }
    text = json.dumps(identity, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
