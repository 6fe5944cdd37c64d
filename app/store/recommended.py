"""Models that suit one workstation GPU, with parameter counts and memory needs computed
from their architecture (the numbers in each model's config.json), not typed in.

On the CPU the estimate is for what the engine will do there (kvdeck.app.store.cpu_plan):
its dtype on this CPU, INT4 layers at 4 bits where the INT4 kernels run them (their output
head int8), the copies the bf16 path keeps."""

from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store.cpu_plan import (
    DTYPE_BYTES,
    CpuFeatures,
    WeightInventory,
    checkpoint_dtype,
    cpu_features,
    cpu_weight_bytes,
    engine_cpu_dtype,
    inventory_from_headers,
    quant_method,
)
from kvdeck.app.store.inspect import InvalidModelError, read_headers

GiB = 1024**3
AWQ_GROUP_SIZE = 128
# CUDA context, activations and allocator slack for a single-GPU engine at small batch.
RUNTIME_OVERHEAD_BYTES = int(1.0 * GiB)
# On the CPU: torch and the engine process itself (no CUDA context).
CPU_RUNTIME_OVERHEAD_BYTES = int(0.5 * GiB)
DEVICES = ("cuda", "cpu")  # where the estimate is for


@dataclass(frozen=True, slots=True)
class Architecture:
    """The config.json fields that decide size: one per family member."""

    family: str  # llama | mistral | qwen2 | qwen3
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None  # None: hidden_size // num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads


@dataclass(frozen=True, slots=True)
class RecommendedModel:
    repo_id: str
    arch: Architecture
    quantization: str | None = None  # "awq" for INT4 checkpoints
    gated: bool = False  # needs a licence accepted on the hub and HF_TOKEN
    note: str = ""

    @property
    def checkpoint_dtype(self) -> str:
        """What config.json says: AutoAWQ checkpoints are float16; the others here bfloat16."""
        return "float16" if self.quantization == "awq" else "bfloat16"


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weight_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    dtype: str | None = None  # the dtype the engine runs the model in (CPU estimates)

    @property
    def model_bytes(self) -> int:
        """What this model itself needs: weights and the KV cache of one sequence."""
        return self.weight_bytes + self.kv_cache_bytes

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes + self.overhead_bytes


def _check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")


def _overhead(device: str) -> int:
    return RUNTIME_OVERHEAD_BYTES if device == "cuda" else CPU_RUNTIME_OVERHEAD_BYTES


def parameter_counts(arch: Architecture) -> tuple[int, int]:
    """(parameters in decoder-layer linears, all other parameters)."""
    h, d = arch.hidden_size, arch.head_size
    q_out, kv_out = arch.num_heads * d, arch.num_kv_heads * d
    attention = h * q_out + 2 * h * kv_out + q_out * h
    mlp = 3 * h * arch.intermediate_size
    linear = arch.num_layers * (attention + mlp)
    per_layer_other = 2 * h  # input and post-attention RMSNorm
    if arch.family == "qwen2":
        per_layer_other += q_out + 2 * kv_out  # q/k/v biases
    if arch.family == "qwen3":
        per_layer_other += 2 * d  # q_norm, k_norm
    embeddings = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    other = arch.num_layers * per_layer_other + embeddings + h  # + final norm
    return linear, other


def num_parameters(arch: Architecture) -> int:
    linear, other = parameter_counts(arch)
    return linear + other


def weight_bytes(arch: Architecture, quantization: str | None) -> int:
    linear, other = parameter_counts(arch)
    if quantization == "awq":
        # 4-bit weights; per group of 128 inputs an fp16 scale and a 4-bit zero point.
        packed = linear // 2 + linear // AWQ_GROUP_SIZE * 2 + linear // AWQ_GROUP_SIZE // 2
        return packed + other * 2
    return (linear + other) * 2  # bf16 / fp16


def kv_cache_bytes_per_token(arch: Architecture, dtype_bytes: int = 2) -> int:
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_size * dtype_bytes


def memory_estimate(model: RecommendedModel, context_tokens: int = 8192,
                    device: str = "cuda", cpu: CpuFeatures | None = None) -> MemoryEstimate:
    """Memory to serve one sequence of `context_tokens` (more sequences share the pool):
    on a GPU in 16 bits, on the CPU as the engine runs it on `cpu` (default: this one)."""
    if context_tokens <= 0:
        raise ValueError(f"context_tokens must be positive, got {context_tokens}")
    _check_device(device)
    if device == "cuda":
        return MemoryEstimate(
            weight_bytes=weight_bytes(model.arch, model.quantization),
            kv_cache_bytes=kv_cache_bytes_per_token(model.arch, 2) * context_tokens,
            overhead_bytes=_overhead(device),
        )
    cpu = cpu or cpu_features()
    quant = {"quant_method": model.quantization, "bits": 4} if model.quantization else None
    dtype = engine_cpu_dtype({"torch_dtype": model.checkpoint_dtype, "quantization_config": quant}, cpu)
    weights = cpu_weight_bytes(architecture_inventory(model.arch, model.quantization),
                               model.quantization is not None, dtype, cpu)
    return MemoryEstimate(
        weight_bytes=weights,
        kv_cache_bytes=kv_cache_bytes_per_token(model.arch, DTYPE_BYTES[dtype]) * context_tokens,
        overhead_bytes=_overhead(device),
        dtype=dtype,
    )


def architecture_inventory(arch: Architecture, quantization: str | None) -> WeightInventory:
    """The weights of `arch` as the CPU engine stores them (AWQ: all its linears in groups of
    AWQ_GROUP_SIZE, taken together)."""
    linear, other = parameter_counts(arch)
    inventory = WeightInventory(int4_layers=[], other_elems=other, vocab=arch.vocab_size,
                                hidden=arch.hidden_size, tied=arch.tie_word_embeddings)
    if quantization == "awq":
        groups = linear // AWQ_GROUP_SIZE
        inventory.int4_layers.append((linear // arch.hidden_size, arch.hidden_size, AWQ_GROUP_SIZE,
                                      linear // 2 + groups // 2, groups))
    else:
        inventory.dense_linear_elems = linear
    return inventory


def format_params(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    return f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count / 1e3:.0f}K"


_QWEN25_05B = Architecture("qwen2", 896, 4864, 24, 14, 2, 151936, True)
_QWEN25_15B = Architecture("qwen2", 1536, 8960, 28, 12, 2, 151936, True)
_QWEN25_3B = Architecture("qwen2", 2048, 11008, 36, 16, 2, 151936, True)
_QWEN25_7B = Architecture("qwen2", 3584, 18944, 28, 28, 4, 152064, False)
_QWEN3_06B = Architecture("qwen3", 1024, 3072, 28, 16, 8, 151936, True, head_dim=128)
_QWEN3_17B = Architecture("qwen3", 2048, 6144, 28, 16, 8, 151936, True, head_dim=128)
_QWEN3_4B = Architecture("qwen3", 2560, 9728, 36, 32, 8, 151936, True, head_dim=128)
_QWEN3_8B = Architecture("qwen3", 4096, 12288, 36, 32, 8, 151936, False, head_dim=128)
_LLAMA32_1B = Architecture("llama", 2048, 8192, 16, 32, 8, 128256, True)
_LLAMA32_3B = Architecture("llama", 3072, 8192, 28, 24, 8, 128256, True)
_LLAMA31_8B = Architecture("llama", 4096, 14336, 32, 32, 8, 128256, False)
_MISTRAL_7B_V03 = Architecture("mistral", 4096, 14336, 32, 32, 8, 32768, False)
_MISTRAL_7B_V02 = Architecture("mistral", 4096, 14336, 32, 32, 8, 32000, False)

RECOMMENDED: tuple[RecommendedModel, ...] = (
    RecommendedModel("Qwen/Qwen2.5-0.5B-Instruct", _QWEN25_05B, note="fast start, small GPUs"),
    RecommendedModel("Qwen/Qwen2.5-0.5B-Instruct-AWQ", _QWEN25_05B, "awq"),
    RecommendedModel("Qwen/Qwen2.5-1.5B-Instruct", _QWEN25_15B),
    RecommendedModel("Qwen/Qwen2.5-1.5B-Instruct-AWQ", _QWEN25_15B, "awq"),
    RecommendedModel("Qwen/Qwen2.5-3B-Instruct", _QWEN25_3B),
    RecommendedModel("Qwen/Qwen2.5-3B-Instruct-AWQ", _QWEN25_3B, "awq"),
    RecommendedModel("Qwen/Qwen2.5-7B-Instruct", _QWEN25_7B),
    RecommendedModel("Qwen/Qwen2.5-7B-Instruct-AWQ", _QWEN25_7B, "awq", note="7B on 8 GB"),
    RecommendedModel("Qwen/Qwen3-0.6B", _QWEN3_06B),
    RecommendedModel("Qwen/Qwen3-1.7B", _QWEN3_17B),
    RecommendedModel("Qwen/Qwen3-4B", _QWEN3_4B),
    RecommendedModel("Qwen/Qwen3-4B-AWQ", _QWEN3_4B, "awq"),
    RecommendedModel("Qwen/Qwen3-8B", _QWEN3_8B),
    RecommendedModel("Qwen/Qwen3-8B-AWQ", _QWEN3_8B, "awq"),
    RecommendedModel("meta-llama/Llama-3.2-1B-Instruct", _LLAMA32_1B, gated=True),
    RecommendedModel("hugging-quants/Llama-3.2-1B-Instruct-AWQ-INT4", _LLAMA32_1B, "awq"),
    RecommendedModel("meta-llama/Llama-3.2-3B-Instruct", _LLAMA32_3B, gated=True),
    RecommendedModel("hugging-quants/Llama-3.2-3B-Instruct-AWQ-INT4", _LLAMA32_3B, "awq"),
    RecommendedModel("meta-llama/Llama-3.1-8B-Instruct", _LLAMA31_8B, gated=True),
    RecommendedModel(
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", _LLAMA31_8B, "awq", note="8B on 8 GB"
    ),
    RecommendedModel("mistralai/Mistral-7B-Instruct-v0.3", _MISTRAL_7B_V03, gated=True),
    RecommendedModel("TheBloke/Mistral-7B-Instruct-v0.2-AWQ", _MISTRAL_7B_V02, "awq"),
)


def local_memory_estimate(config: dict, weight_bytes_on_disk: int, context_tokens: int = 8192,
                          device: str = "cuda", model_dir: Path | None = None,
                          cpu: CpuFeatures | None = None) -> MemoryEstimate:
    """The same estimate for a model on disk, KV from its config for one sequence of
    `context_tokens` (or of the model's whole context if that is shorter). On a GPU: its
    weights as stored, KV in 16 bits. On the CPU (`cpu`, default this one): as the engine runs
    it there, from its safetensors headers in `model_dir` (kvdeck.app.store.cpu_plan), its KV
    in the engine's dtype; without the folder, its weights as stored in that dtype."""
    if context_tokens <= 0:
        raise ValueError(f"context_tokens must be positive, got {context_tokens}")
    _check_device(device)
    heads = int(config.get("num_attention_heads") or 1)
    head_size = int(config.get("head_dim") or int(config.get("hidden_size", 0)) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    layers = int(config.get("num_hidden_layers") or 0)
    context = min(context_tokens, int(config.get("max_position_embeddings") or context_tokens))
    kv_per_element = 2 * layers * kv_heads * head_size * context
    if device == "cuda":
        return MemoryEstimate(weight_bytes=weight_bytes_on_disk, kv_cache_bytes=kv_per_element * 2,
                              overhead_bytes=_overhead(device))
    cpu = cpu or cpu_features()
    dtype = engine_cpu_dtype(config, cpu)
    quantized = quant_method(config) is not None
    try:
        if model_dir is None:
            raise InvalidModelError("no folder")
        weights = cpu_weight_bytes(inventory_from_headers(read_headers(Path(model_dir)), config),
                                   quantized, dtype, cpu)
    except (InvalidModelError, KeyError, TypeError, ValueError):
        stored = DTYPE_BYTES.get(checkpoint_dtype(config), 4)
        weights = weight_bytes_on_disk * (1 if quantized else DTYPE_BYTES[dtype] // stored or 1)
    return MemoryEstimate(weight_bytes=weights, kv_cache_bytes=kv_per_element * DTYPE_BYTES[dtype],
                          overhead_bytes=_overhead(device), dtype=dtype)
