"""The GGUF that llama.cpp runs as an INT4 model's baseline when --llama-cpp-gguf is not given:
the nearest 4-bit file kvdeck knows of, so that both sides read about as many bytes per token.

That is the GGUF the model was imported from, or the one the dense model it was quantised
from was imported from (the registry records both: `gguf_file` for an import, `origin_path`
for a quantise job), when that file is still there and is a 4-bit type (Q4_*, IQ4_*,
MXFP4). Otherwise the error says how to make one. A dense model keeps needing the flag.
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

FOUR_BIT_PREFIXES = ("Q4_", "IQ4_", "MXFP4")
NEEDS_GGUF = ("--baseline llama.cpp needs --llama-cpp-gguf (the same model as GGUF: "
              "python benchmarks/llama_cpp.py convert MODEL_DIR OUT.gguf)")


@dataclass(frozen=True, slots=True)
class BaselineGGUF:
    path: Path
    quantization: str | None  # the file's type as llama.cpp names it (Q4_1, F16...); None: unread
    chosen_because: str  # "--llama-cpp-gguf", or where it came from


def is_four_bit(quantization: str | None) -> bool:
    return bool(quantization) and quantization.upper().startswith(FOUR_BIT_PREFIXES)


def is_int4_checkpoint(model_dir: Path) -> bool:
    """config.json holds a 4-bit quantization_config (AWQ, GPTQ)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quant, dict):
        return False
    return (quant.get("bits") or quant.get("w_bit")) == 4


def provenance(model_dir: Path) -> list[tuple[Path, dict]]:
    """The model's folder and the folders of the models it was made from, nearest first, each
    with its registry record (a model the registry does not know ends the chain)."""
    from kvdeck.app.store import registry

    records: dict[Path, dict] = {}
    for record in registry.read()["verified"].values():
        if record.get("path"):
            records.setdefault(Path(record["path"]).resolve(), record)
    chain: list[tuple[Path, dict]] = []
    current: Path | None = Path(model_dir).resolve()
    while current is not None and current not in {folder for folder, _ in chain}:
        record = records.get(current)
        if record is None:
            break
        chain.append((current, record))
        origin = record.get("origin_path")
        current = Path(origin).resolve() if origin else None
    return chain


def gguf_origins(model_dir: Path) -> list[tuple[Path, str | None, Path]]:
    """The GGUF files this model, then the models it was made from, were imported from, nearest
    first: (file, the type the import recorded, the imported model's folder)."""
    return [(Path(record["gguf_file"]), record.get("gguf_quantization"), folder)
            for folder, record in provenance(model_dir) if record.get("gguf_file")]


def choose_baseline_gguf(args: argparse.Namespace, model_dir: Path) -> BaselineGGUF:
    """--llama-cpp-gguf, or for an INT4 model its nearest 4-bit GGUF; ValueError if none."""
    from kvdeck.app.bench.llama_cpp import gguf_file_type

    if args.llama_cpp_gguf:
        path = Path(args.llama_cpp_gguf).expanduser()
        return BaselineGGUF(path, gguf_file_type(path), "--llama-cpp-gguf")
    if not is_int4_checkpoint(model_dir):
        raise ValueError(NEEDS_GGUF)
    model_dir = Path(model_dir).resolve()
    seen_types = []
    for path, recorded, imported in gguf_origins(model_dir):
        if not path.is_file():
            seen_types.append(f"{path} (gone)")
            continue
        quantization = gguf_file_type(path) or recorded
        if is_four_bit(quantization):
            why = (f"{imported.name} was imported from it" if imported == model_dir
                   else f"{model_dir.name} was quantised from {imported.name}, imported from it")
            return BaselineGGUF(path, quantization, why)
        seen_types.append(f"{path} ({quantization or 'unknown type'})")
    known = f" (its GGUF origins: {', '.join(seen_types)})" if seen_types else ""
    dense = next((str(folder) for folder, _ in provenance(model_dir) if not is_int4_checkpoint(folder)),
                 "DENSE_MODEL_DIR")
    raise ValueError(
        f"--baseline llama.cpp on the INT4 model {Path(model_dir).name}: no 4-bit GGUF is known for it"
        f"{known}. Give one with --llama-cpp-gguf, or make one from the dense model with "
        f"`python benchmarks/llama_cpp.py quantize {dense} OUT.gguf --type Q4_1` (llama.cpp's converter "
        "to F16, then llama-quantize)")
