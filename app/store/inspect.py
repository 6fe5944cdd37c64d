"""Read what a model directory holds without loading it: config.json, safetensors headers.

Used both to describe a model in the store's list and to verify a download: a safetensors
file whose header does not parse, or whose size does not match the header's offsets, is
corrupt or truncated.
"""

import json
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kvdeck.engine.types.architectures import SUPPORTED_ARCHITECTURES

_MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


class InvalidModelError(ValueError):
    """The directory is not a complete, readable model (missing or corrupt file)."""


@dataclass(slots=True)
class SafetensorsSummary:
    num_params: int
    dtype_bytes: dict[str, int]  # safetensors dtype name -> bytes of tensors with it


@dataclass(slots=True)
class ModelDescription:
    architecture: str
    num_params: int
    dtype: str
    quantization: str | None
    size_bytes: int
    supported: bool
    config: dict


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise InvalidModelError(f"{model_dir}: config.json is missing") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise InvalidModelError(f"{path}: expected a JSON object")
    return config


def read_safetensors_header(path: Path) -> dict:
    """Parse and check the header; raises InvalidModelError if the file is truncated or corrupt."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) != 8:
                raise InvalidModelError(f"{path.name}: truncated (no safetensors header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES or 8 + header_len > file_size:
                raise InvalidModelError(f"{path.name}: bad safetensors header length {header_len}")
            header = json.loads(f.read(header_len))
    except OSError as exc:
        raise InvalidModelError(f"{path.name}: cannot read ({exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"{path.name}: safetensors header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise InvalidModelError(f"{path.name}: safetensors header is not a JSON object")
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = entry["data_offsets"]
            nbytes = _DTYPE_BYTES[entry["dtype"]] * _numel(entry["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidModelError(f"{path.name}: bad header entry for {name!r}") from exc
        if end - start != nbytes or start < 0:
            raise InvalidModelError(f"{path.name}: tensor {name!r} has inconsistent offsets")
        data_end = max(data_end, end)
    if file_size != 8 + header_len + data_end:
        raise InvalidModelError(
            f"{path.name}: size {file_size} does not match its header ({8 + header_len + data_end});"
            " the file is truncated or corrupt"
        )
    return header


def tensor_bytes(entry: dict) -> int:
    """The bytes of one tensor of a (checked) safetensors header."""
    return _DTYPE_BYTES[entry["dtype"]] * _numel(entry["shape"])


def read_headers(model_dir: Path) -> list[dict]:
    """Every weight file's safetensors header (InvalidModelError if one is missing or corrupt)."""
    return [read_safetensors_header(path) for path in weight_files(model_dir)]


def summarize_safetensors(files: list[Path]) -> SafetensorsSummary:
    num_params = 0
    dtype_bytes: Counter[str] = Counter()
    for path in files:
        for name, entry in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            numel = _numel(entry["shape"])
            dtype_bytes[entry["dtype"]] += numel * _DTYPE_BYTES[entry["dtype"]]
            num_params += _logical_params(name, entry["dtype"], numel)
    return SafetensorsSummary(num_params=num_params, dtype_bytes=dict(dtype_bytes))


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files the model needs; every shard the index names must be present."""
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            shard_names = sorted(set(weight_map.values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidModelError(f"{index_path.name}: not a valid safetensors index") from exc
        missing = [name for name in shard_names if not (model_dir / name).is_file()]
        if missing:
            raise InvalidModelError(f"{model_dir}: missing weight shard(s) {', '.join(missing)}")
        return [model_dir / name for name in shard_names]
    files = sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())
    if not files:
        raise InvalidModelError(f"{model_dir}: no *.safetensors weights")
    return files


def describe_model(model_dir: Path) -> ModelDescription:
    """Architecture, parameter count, dtype, quantisation and size of a complete model directory."""
    config = read_config(model_dir)
    summary = summarize_safetensors(weight_files(model_dir))
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else str(config.get("model_type", "unknown"))
    return ModelDescription(
        architecture=architecture,
        num_params=summary.num_params,
        dtype=_model_dtype(config, summary),
        quantization=quantization_of(config),
        size_bytes=directory_size(model_dir),
        supported=architecture in SUPPORTED_ARCHITECTURES,
        config=config,
    )


def quantization_of(config: dict) -> str | None:
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "unknown"))
    bits = qc.get("bits") or qc.get("w_bit")
    return f"{method}-int{bits}" if bits else method


def directory_size(model_dir: Path) -> int:
    """Bytes on disk, following the hub cache's symlinks and counting each blob once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, names in os.walk(model_dir):
        for name in names:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # dangling symlink
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _model_dtype(config: dict, summary: SafetensorsSummary) -> str:
    declared = config.get("torch_dtype") or config.get("dtype")
    if isinstance(declared, str) and declared:
        return declared
    floats = {k: v for k, v in summary.dtype_bytes.items() if k in _DTYPE_NAMES}
    if not floats:
        return "unknown"
    return _DTYPE_NAMES[max(floats, key=floats.__getitem__)]


def _logical_params(name: str, dtype: str, numel: int) -> int:
    # AWQ packs eight 4-bit weights per int32; its zeros and scales are not parameters.
    if name.endswith(".qweight") and dtype == "I32":
        return numel * 8
    if name.endswith((".qzeros", ".scales", ".g_idx")):
        return 0
    return numel


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or dim < 0:
            raise ValueError(f"bad dimension {dim!r}")
        count *= dim
    return count
