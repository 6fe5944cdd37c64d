"""What the engine's settings mean on this machine: the torch device, the dtype, the
default token budget. Kept here, next to the model, so the light config imports no torch."""

import torch

from kvdeck.engine.types.config import DTYPE_ALIASES, EngineConfig
from kvdeck.engine.types.model_config import ModelConfig
from kvdeck.kernels.cpu import int4 as cpu_int4
from kvdeck.kernels.cpu.linear import bf16_packing_supported

# vLLM's defaults: a GPU step can take a large batch; a CPU step's time grows with it.
DEFAULT_TOKEN_BUDGET = {"cuda": 8192, "cpu": 2048}


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is available")
    return torch.device(config.device)


def token_budget(config: EngineConfig, device: torch.device) -> int:
    """max_num_batched_tokens, or the device's default."""
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    return DEFAULT_TOKEN_BUDGET["cuda" if device.type == "cuda" else "cpu"]


def torch_dtype(name: str) -> torch.dtype:
    """A dtype name from EngineConfig or config.json as a torch dtype."""
    return getattr(torch, DTYPE_ALIASES[name])


def resolve_dtype(config: EngineConfig, model_config: ModelConfig, device: torch.device) -> torch.dtype:
    """auto: on CUDA the checkpoint's dtype (bf16/fp16 for an fp32 one); on CPU bfloat16 for a
    bfloat16 checkpoint where the CPU does bf16 matmuls natively (avx512_bf16 / AMX: 2.1x the
    batch-1 decode speed of float32 on SmolLM2-135M, benchmarks/results/cpu_dtype_smollm2.json),
    and for an INT4 (AWQ, GPTQ) one where the CPU also has the INT4 kernels (its products quantise
    their activations to int8 whatever the dtype, and the dense rest, the output head above
    all, reads half fp32's bytes: AutoAWQ checkpoints are float16, which this CPU does not
    compute in), otherwise float32. dtype="float32" keeps comparisons with transformers in
    fp32 (the same greedy tokens; with KVDECK_CPU_NATIVE=0 bit for bit the torch references)."""
    if config.dtype != "auto":
        return torch_dtype(config.dtype)
    if device.type != "cuda":
        if not bf16_packing_supported():
            return torch.float32
        if model_config.checkpoint_dtype == "bfloat16":
            return torch.bfloat16
        int4 = (config.quantization in ("awq", "gptq") and config.attention_backend == "auto"
                and cpu_int4.available())
        return torch.bfloat16 if int4 else torch.float32
    if model_config.checkpoint_dtype == "float32":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch_dtype(model_config.checkpoint_dtype)
