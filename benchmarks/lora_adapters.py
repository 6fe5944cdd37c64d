"""Random LoRA adapters in PEFT's folder format (adapter_config.json + adapter_model.safetensors)
for a model given only its config.json (the GPU benches run config-only models with dummy
weights, and the GPU image has no peft): every projection (q/k/v/o, gate/up/down) of every
layer, A and B from a normal law (B non-zero, unlike PEFT's start, so the adapter changes
the output)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """Each target's (in, out) for a Llama/Qwen-style config."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    inter = config["intermediate_size"]
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def write_random_adapter(model_dir: Path, out: Path, rank: int, seed: int, scale: float = 0.02) -> Path:
    """A rank-`rank` adapter for the model in `model_dir`, written to `out`."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (in_size, out_size) in projection_shapes(config).items():
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_size, generator=gen) / in_size ** 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_size, rank, generator=gen) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS),
        "lora_dropout": 0.0, "bias": "none", "base_model_name_or_path": str(model_dir)}))
    return out
