"""Engine configuration: vLLM's knob names, validated with errors that name the field.

Light: no torch. What depends on the machine (the device, the default token budget) is
resolved where the model runs (`kvdeck.engine.runner.device`).
"""

from dataclasses import dataclass, fields
from typing import Any

from kvdeck.engine.types.quantization import linear_method_names
from kvdeck.engine.types.speculative import SpeculativeConfig
from kvdeck.kernels.ops import KERNEL_BACKENDS

# Names, not torch dtypes: the UI process imports this module and should not pay for torch.
DTYPE_ALIASES = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}
DEVICES = ("auto", "cuda", "cpu")
# vLLM's names: fp8 is e4m3; a 16-bit name stores a float32 model's K/V in 16 bits.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")
BLOCK_SIZES = (8, 16, 32, 64, 128)
PREEMPTION_MODES = ("auto", "swap", "recompute")


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # local directory or hub id; None means the bundled demo model
    tokenizer: str | None = None
    block_size: int = 16
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: 8192 on CUDA, 2048 on CPU
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gib: float = 1.0  # KV pool size where no GPU is profiled
    num_gpu_blocks_override: int | None = None  # fix the pool size (tests, debugging)
    enable_prefix_caching: bool = True
    # The prefix cache's lower tiers (engine/core/kv_tiers.py). kv_offload_gib: GiB of host memory
    # keeping full blocks evicted from the pool (vLLM's kv_offloading_size; 0: off). kv_cache_dir:
    # a folder keeping full blocks across restarts (None: off), at most kv_cache_dir_gib GiB.
    kv_offload_gib: float = 0.0
    kv_cache_dir: str | None = None
    kv_cache_dir_gib: float = 10.0
    dtype: str = "auto"  # auto: the checkpoint's dtype on CUDA; on CPU engine/runner/device.py's rule
    seed: int = 0
    load_format: str = "auto"  # auto | dummy
    quantization: str | None = None  # awq | gptq | bnb-nf4 | int8 | None (awq, gptq: from config.json)
    device: str = "auto"  # auto | cuda | cpu
    attention_backend: str = "auto"  # auto | triton | torch
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8 | fp8_e4m3 | fp8_e5m2 | int8 | ...
    enforce_eager: bool = False  # no CUDA graphs, no compiled decode
    compile_decode: bool = False  # CPU: torch.compile (inductor) the decode forward, per batch bucket
    trust_remote_code: bool = False  # refused: kvdeck runs only its own model code
    allow_pickle: bool = False  # allow loading .bin/.pt checkpoints (pickle) when no safetensors
    # vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4, ...} or {"model": DIR, ...}
    speculative_config: dict | None = None
    # Multi-LoRA (vLLM's knobs; engine/runner/lora/): adapters in `max_loras` device slots of
    # rank up to `max_lora_rank`, host copies of `max_cpu_loras` (None: as many as max_loras).
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 64
    max_cpu_loras: int | None = None
    # CPU threads of the kernels. None: adaptive, up to torch's thread count (OMP_NUM_THREADS pins
    # it), fewer while other processes keep cores busy (engine/runner/cpu_threads.py); N: N always.
    cpu_threads: int | None = None
    # The host schedules and prepares step N+1 while the device runs step N (engine/core/
    # pipeline.py). None: on with CUDA, off on the CPU (one device does both).
    async_scheduling: bool | None = None
    # A request preempted when the KV pool runs dry (engine/core/swap.py): "swap" copies its
    # blocks to host swap space and back, "recompute" drops them, "auto" swaps one with at least
    # SWAP_MIN_TOKENS computed tokens while the space has room. swap_space: GiB of host memory
    # for swapped-out blocks (vLLM's), capped at half the memory free when the engine starts.
    preemption_mode: str = "auto"
    swap_space: float = 4.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        _positive_int("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if not isinstance(self.gpu_memory_utilization, int | float) or not (
            0.0 < self.gpu_memory_utilization <= 1.0
        ):
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if not isinstance(self.kv_cache_memory_gib, int | float) or self.kv_cache_memory_gib <= 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib!r}")
        if self.num_gpu_blocks_override is not None:
            _positive_int("num_gpu_blocks_override", self.num_gpu_blocks_override)
        if self.dtype != "auto" and self.dtype not in DTYPE_ALIASES:
            raise ValueError(
                f"dtype must be 'auto' or one of {sorted(DTYPE_ALIASES)}, got {self.dtype!r}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        methods = linear_method_names()
        if self.quantization is not None and self.quantization not in methods:
            raise ValueError(f"quantization must be one of {methods} or None, got {self.quantization!r}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be True, False or None, got {self.async_scheduling!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.attention_backend not in KERNEL_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {KERNEL_BACKENDS}, got {self.attention_backend!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.cpu_threads is not None:
            _positive_int("cpu_threads", self.cpu_threads)
        _check_tier_knobs(self)
        _check_lora_knobs(self)
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, "
                             f"got {self.preemption_mode!r}")
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, int | float) \
                or self.swap_space < 0:
            raise ValueError(f"swap_space must be a number of GiB >= 0, got {self.swap_space!r}")
        if self.preemption_mode == "swap" and self.swap_space == 0:
            raise ValueError("preemption_mode='swap' needs swap space: set swap_space > 0 (GiB)")
        if self.trust_remote_code:
            raise ValueError(
                "trust_remote_code is not supported: kvdeck runs only its own model implementations"
            )

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The parsed speculative_config (None: no speculative decoding)."""
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_dict(self.speculative_config)

    @property
    def cpu_loras(self) -> int:
        """Adapters kept in host memory (max_cpu_loras, or max_loras when unset)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_kwargs(cls, model: str | None, **kwargs: Any) -> "EngineConfig":
        unknown = sorted(set(kwargs) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(model=model, **kwargs)


def _check_lora_knobs(config: EngineConfig) -> None:
    if not isinstance(config.enable_lora, bool):
        raise ValueError(f"enable_lora must be True or False, got {config.enable_lora!r}")
    _positive_int("max_loras", config.max_loras)
    _positive_int("max_lora_rank", config.max_lora_rank)
    if config.max_cpu_loras is not None:
        _positive_int("max_cpu_loras", config.max_cpu_loras)
        if config.max_cpu_loras < config.max_loras:
            raise ValueError(f"max_cpu_loras ({config.max_cpu_loras}) must be >= max_loras "
                             f"({config.max_loras})")


def _check_tier_knobs(config: EngineConfig) -> None:
    for name in ("kv_offload_gib", "kv_cache_dir_gib"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{name} must be a number of GiB >= 0, got {value!r}")
    if config.kv_cache_dir is not None:
        if not isinstance(config.kv_cache_dir, str) or not config.kv_cache_dir.strip():
            raise ValueError(f"kv_cache_dir must be a folder path, got {config.kv_cache_dir!r}")
        if config.kv_cache_dir_gib <= 0:
            raise ValueError(f"kv_cache_dir_gib must be > 0 with a kv_cache_dir, "
                             f"got {config.kv_cache_dir_gib!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")

