"""Write an AWQ checkpoint in AutoAWQ's GEMM layout, atomically.

Everything goes into a hidden temporary directory beside the target, which is renamed
into place only when complete: an interrupted or failed run (disk full, Ctrl-C) leaves
no half-written model, only nothing.
"""

import errno
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvdeck.quant.staging import pid_alive

AWQ_QUANTIZATION_CONFIG = {
    "quant_method": "awq",
    "bits": 4,
    "group_size": 128,
    "zero_point": True,
    "version": "gemm",
}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
    "chat_template.json", "generation_config.json",
)
MAX_SHARD_BYTES = 4 * 1024**3
_PARTIAL = ".partial-"


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def check_output_dir(out_dir: Path, needed_bytes: int = 0) -> None:
    """Fail before hours of calibration if the result could not be written."""
    if out_dir.exists():
        raise ValueError(f"output directory {str(out_dir)!r} already exists; choose another --out")
    parent = out_dir.parent
    if not parent.is_dir():
        raise ValueError(f"parent directory {str(parent)!r} of the output does not exist")
    free = shutil.disk_usage(parent).free
    if needed_bytes and free < needed_bytes:
        raise OSError(
            errno.ENOSPC,
            f"not enough disk space in {str(parent)!r}: about {needed_bytes / 1e9:.2f} GB needed, "
            f"{free / 1e9:.2f} GB free",
        )


def write_awq_checkpoint(
    out_dir: str | Path,
    tensors: dict[str, torch.Tensor],
    config: dict,
    source_dir: str | Path | None,
    group_size: int = 128,
) -> Path:
    """Save `tensors` (safetensors, sharded above 4 GiB), config.json with the AWQ
    `quantization_config`, and the source's tokenizer files; return the final path."""
    out_dir = Path(out_dir).resolve()
    check_output_dir(out_dir, tensor_bytes(tensors))
    _remove_stale_partials(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}{_PARTIAL}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _save_shards(tmp, tensors)
        config = dict(config)
        config["quantization_config"] = {**AWQ_QUANTIZATION_CONFIG, "group_size": group_size}
        config["torch_dtype"] = "float16"
        if "dtype" in config:
            config["dtype"] = "float16"
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if source_dir is not None:
            for name in TOKENIZER_FILES:
                src = Path(source_dir) / name
                if src.is_file():
                    shutil.copyfile(src, tmp / name)
        os.rename(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC, f"disk full while writing {str(out_dir)!r}; nothing was kept"
            ) from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _save_shards(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], directory / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        filename = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, filename))
    index_data = {"metadata": {"total_size": tensor_bytes(tensors)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_data, indent=2))


def _remove_stale_partials(out_dir: Path) -> None:
    """Temporary directories left by runs that were killed outright (their pid is gone)."""
    for path in out_dir.parent.glob(f".{out_dir.name}{_PARTIAL}*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
