"""What a GGUF file is, read from its header only: architecture, quantisation, size.

Listing a store of GGUF models must be quick, so this reads the metadata with transformers'
GGUF metadata reader, which skips the vocabulary's strings (the `gguf` package's full reader
takes seconds per file on a 150k vocabulary). The import itself reads everything with `gguf`.
"""

import struct
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
# GGUF architectures whose tensors transformers can name and kvdeck can run, with the
# config.json architecture each becomes (llama.cpp stores Mistral as "llama").
KVDECK_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class GGUFImportError(ValueError):
    """A GGUF file cannot be imported; the message names the problem, for the user."""


@dataclass(slots=True)
class GGUFSummary:
    path: Path
    architecture: str  # the GGUF's own name, e.g. "llama"
    model_name: str | None  # general.name, if the file has one
    quantization: str  # general.file_type as llama.cpp names it, e.g. "Q4_K_M", "F16"
    size_bytes: int
    num_layers: int | None
    context_length: int | None
    split_count: int = 1  # llama.cpp's gguf-split: the model continues in other files

    @property
    def supported(self) -> bool:
        return self.architecture in KVDECK_ARCHITECTURES


def check_magic(path: Path) -> int:
    """The file's size; raises GGUFImportError if it is missing or does not start like a GGUF."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise GGUFImportError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GGUFImportError(f"{path}: is a directory, not a .gguf file") from None
    except OSError as exc:
        raise GGUFImportError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if magic != GGUF_MAGIC:
        raise GGUFImportError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
    return size


def read_gguf_metadata(path: Path) -> dict:
    """The metadata keys (string arrays left as their length); GGUFImportError if unreadable."""
    from transformers.integrations.gguf import read_gguf_metadata as read_metadata

    check_magic(path)
    try:
        metadata, _ = read_metadata(str(path))
    except (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, KeyError) as exc:
        raise GGUFImportError(f"{path}: truncated or corrupt GGUF header ({exc})") from None
    return metadata


def read_gguf_summary(path: str | Path) -> GGUFSummary:
    path = Path(path).expanduser()
    metadata = read_gguf_metadata(path)
    arch = str(metadata["general.architecture"])
    name = metadata.get("general.name")
    layers = metadata.get(f"{arch}.block_count")
    context = metadata.get(f"{arch}.context_length")
    return GGUFSummary(
        path=path,
        architecture=arch,
        model_name=str(name) if name else None,
        quantization=file_type_name(metadata.get("general.file_type")),
        size_bytes=path.stat().st_size,
        num_layers=int(layers) if isinstance(layers, int) else None,
        context_length=int(context) if isinstance(context, int) else None,
        split_count=int(metadata.get("split.count") or 1),
    )


def file_type_name(file_type: object) -> str:
    """llama.cpp's name for `general.file_type` (MOSTLY_Q4_K_M -> Q4_K_M), or "unknown"."""
    from gguf import LlamaFileType

    if not isinstance(file_type, int):
        return "unknown"
    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def unsupported_architecture_error(path: Path, architecture: str) -> GGUFImportError:
    supported = ", ".join(f"{k} ({v})" for k, v in KVDECK_ARCHITECTURES.items())
    return GGUFImportError(
        f"{path.name}: GGUF architecture {architecture!r} is not supported by kvdeck's import"
        f" (supported: {supported})"
    )
