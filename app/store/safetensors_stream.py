"""Write safetensors shards one tensor (or one slice of rows) at a time.

`safetensors.torch.save_file` wants every tensor of a shard in memory at once; a 7B model
dequantised from GGUF would then need several GB at a time. The format is a JSON header
with each tensor's dtype, shape and byte range, then the bytes in that order, so once all
shapes are known (they are, from the GGUF header) the header can be written first and the
data streamed after it.
"""

import json
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import BinaryIO

import torch

_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
DEFAULT_SHARD_BYTES = 2 * 1024**3


@dataclass(slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    def nbytes(self, dtype: torch.dtype) -> int:
        return prod(self.shape) * dtype.itemsize


@dataclass(slots=True)
class ShardPlan:
    """Which tensors go in which file, in the order they will be written."""

    dtype: torch.dtype
    shards: list[list[TensorSpec]]

    @classmethod
    def make(cls, specs: list[TensorSpec], dtype: torch.dtype, max_shard_bytes: int) -> "ShardPlan":
        shards: list[list[TensorSpec]] = [[]]
        size = 0
        for spec in specs:
            nbytes = spec.nbytes(dtype)
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(spec)
            size += nbytes
        return cls(dtype, shards)

    def filename(self, index: int) -> str:
        if len(self.shards) == 1:
            return "model.safetensors"
        return f"model-{index + 1:05d}-of-{len(self.shards):05d}.safetensors"

    @property
    def total_bytes(self) -> int:
        return sum(spec.nbytes(self.dtype) for shard in self.shards for spec in shard)

    def write_index(self, directory: Path) -> None:
        """model.safetensors.index.json, for more than one shard (as transformers writes it)."""
        if len(self.shards) == 1:
            return
        weight_map = {spec.name: self.filename(i) for i, shard in enumerate(self.shards) for spec in shard}
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


@dataclass(slots=True)
class ShardWriter:
    """One shard file: the header goes out on open, then each tensor's rows in plan order."""

    path: Path
    specs: list[TensorSpec]
    dtype: torch.dtype
    _file: BinaryIO | None = None
    _index: int = 0  # the tensor being written
    _written: int = 0  # bytes of it written so far
    _sizes: list[int] = field(default_factory=list)

    def __enter__(self) -> "ShardWriter":
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for spec in self.specs:
            nbytes = spec.nbytes(self.dtype)
            header[spec.name] = {
                "dtype": _SAFETENSORS_DTYPES[self.dtype],
                "shape": list(spec.shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._sizes.append(nbytes)
            offset += nbytes
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors does
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(encoded)))
        self._file.write(encoded)
        return self

    def write(self, name: str, rows: torch.Tensor) -> None:
        """Append `rows` (the whole tensor, or its next rows) of tensor `name`."""
        assert self._file is not None
        spec = self.specs[self._index] if self._index < len(self.specs) else None
        if spec is None or spec.name != name:
            expected = spec.name if spec else "nothing more"
            raise ValueError(f"{self.path.name}: got tensor {name!r}, expected {expected}")
        if rows.dtype != self.dtype or tuple(rows.shape[1:]) != spec.shape[1:]:
            raise ValueError(
                f"tensor {name!r}: rows of shape {tuple(rows.shape)} {rows.dtype} do not fit"
                f" {spec.shape} {self.dtype}"
            )
        data = rows.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        if self._written + data.nbytes > self._sizes[self._index]:
            raise ValueError(f"tensor {name!r}: more rows than its shape {spec.shape}")
        self._file.write(data)
        self._written += data.nbytes
        if self._written == self._sizes[self._index]:
            self._index += 1
            self._written = 0

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._file is not None
        self._file.close()
        if exc_type is None and self._index != len(self.specs):
            raise ValueError(f"{self.path.name}: only {self._index} of {len(self.specs)} tensors written")
