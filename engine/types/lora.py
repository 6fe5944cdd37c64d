"""LoRA adapters as vLLM names them: a `LoRARequest` picks an adapter for a request, and
`read_adapter_info` reads and checks a PEFT adapter folder (`adapter_config.json` and
`adapter_model.safetensors`). Light: no torch; the weights are read by the runner
(engine/runner/lora/).
"""

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# The projections an adapter may target (PEFT's names for the Llama family's layers).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's `LoRARequest(lora_name, lora_int_id, lora_path)`: `lora_int_id` (>= 1) names
    the adapter inside the engine, `lora_path` is its PEFT folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) \
                or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a non-empty string, got {self.lora_path!r}")


@dataclass(frozen=True, slots=True)
class LoRAAdapterInfo:
    """What an adapter folder's adapter_config.json says (checked)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_model_name_or_path: str | None
    path: str
    use_rslora: bool = False

    @property
    def scaling(self) -> float:
        """PEFT's: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def read_adapter_info(path: str | Path) -> LoRAAdapterInfo:
    """Read and check a PEFT LoRA folder; ValueError naming the problem (a missing folder or
    file, not a LoRA adapter, a bad rank, options kvdeck does not serve, a path the file
    system refuses)."""
    try:
        return _read_adapter_info(Path(path).expanduser())
    except OSError as exc:  # a name too long, a folder that cannot be read
        raise ValueError(f"LoRA adapter {str(path)!r} cannot be read: {exc.strerror or exc}") from None


def _read_adapter_info(folder: Path) -> LoRAAdapterInfo:
    if not folder.exists():
        raise ValueError(f"LoRA adapter folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter path {str(folder)!r} is not a folder")
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        raise ValueError(f"{str(folder)!r} is not a LoRA adapter: it has no {ADAPTER_CONFIG}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ValueError(f"{str(folder)!r} is not a LoRA adapter: its peft_type is {peft_type!r}")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"{config_path}: the rank r must be a positive integer, got {rank!r}")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"{config_path}: lora_alpha must be a positive number, got {alpha!r}")
    targets = _target_modules(config.get("target_modules"), config_path)
    for option, off in (("use_dora", False), ("rank_pattern", {}), ("alpha_pattern", {}),
                        ("modules_to_save", None), ("bias", "none")):
        value = config.get(option, off)
        if value not in (off, None) and value != {} and value != []:
            raise ValueError(f"{config_path}: {option}={value!r} is not supported (kvdeck serves "
                             "plain LoRA: one rank and alpha, no trained bias or extra modules)")
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        hint = " (adapter_model.bin: pickled weights are not loaded; save with safetensors)" \
            if (folder / "adapter_model.bin").is_file() else ""
        raise ValueError(f"LoRA adapter {str(folder)!r} has no {ADAPTER_WEIGHTS}{hint}")
    base = config.get("base_model_name_or_path")
    return LoRAAdapterInfo(rank, float(alpha), targets, base if isinstance(base, str) else None,
                           str(folder), bool(config.get("use_rslora", False)))


def _target_modules(value: object, config_path: Path) -> tuple[str, ...]:
    if isinstance(value, str):  # PEFT reads a string as a regex; a plain name is one module
        if not value.isidentifier():
            raise ValueError(f"{config_path}: target_modules {value!r} is a pattern; kvdeck needs "
                             f"the module names (of {', '.join(TARGET_MODULES)})")
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(m, str) for m in value):
        raise ValueError(f"{config_path}: target_modules must be a non-empty list of names, got {value!r}")
    unknown = sorted(set(value) - set(TARGET_MODULES))
    if unknown:
        raise ValueError(f"{config_path}: unknown target module(s) {', '.join(unknown)}; kvdeck "
                         f"applies adapters to {', '.join(TARGET_MODULES)}")
    return tuple(sorted(set(value), key=TARGET_MODULES.index))


def check_lora_request(lora_request: object, enable_lora: bool) -> None:
    """ValueError unless `lora_request` is None or a LoRARequest the engine may take."""
    if lora_request is None:
        return
    if not isinstance(lora_request, LoRARequest):
        raise ValueError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
    if not enable_lora:
        raise ValueError(f"LoRA adapter {lora_request.lora_name!r} asked for, but LoRA is off: start "
                         "the engine with enable_lora=True (--enable-lora)")


def lora_requests_per_prompt(lora_request: "LoRARequest | Sequence[LoRARequest | None] | None",
                             count: int) -> list[LoRARequest | None]:
    """One adapter (or None) for every prompt, from one or a list of one per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * count
    if isinstance(lora_request, str | bytes) or not isinstance(lora_request, Sequence):
        raise ValueError(f"lora_request must be a LoRARequest, a list of them or None, "
                         f"got {type(lora_request).__name__}")
    if len(lora_request) != count:
        raise ValueError(f"got {len(lora_request)} lora requests for {count} prompts")
    return list(lora_request)


@lru_cache(maxsize=1024)
def _digest(name: str, path: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{name}\0{path}".encode()).digest()[:7], "little")


def lora_cache_key(lora_request: LoRARequest) -> int:
    """A number for the prefix cache's root hash: the same adapter (name and folder) gives the
    same number in every process (Python's str hash does not), so the disk tier keys it too."""
    return _digest(lora_request.lora_name, str(Path(lora_request.lora_path).expanduser()))
