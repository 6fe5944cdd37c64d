"""Perplexity of a model on a text file, as `kvdeck eval-ppl` and the quality benchmark
measure it: a dense checkpoint through transformers, an AWQ (or round-to-nearest) INT4
checkpoint through kvdeck's INT4 layers inside transformers, or a dense checkpoint with its
decoder weights NF4-quantised as kvdeck's bnb-nf4 runs them."""

import json
from pathlib import Path

import torch

from kvdeck.quant.awq_pipeline import pick_device, resolve_model_dir
from kvdeck.quant.awq_quantizer import LINEAR_NAMES
from kvdeck.quant.perplexity import PerplexityResult, hf_logits_fn, perplexity


def evaluate_perplexity(model: str, text_file: str, seq_len: int = 512, max_windows: int | None = None,
                        device: str = "auto", quantization: str | None = None,
                        ) -> tuple[PerplexityResult, str, str]:
    """(result, what was scored, device type)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvdeck.quant.hf_int4 import load_awq_into_transformers

    model_dir = resolve_model_dir(model)
    text_path = Path(text_file)
    if not text_path.is_file():
        raise ValueError(f"--file {text_file!r} does not exist")
    if max_windows is not None and max_windows <= 0:
        raise ValueError(f"--max-windows must be > 0, got {max_windows}")
    target = pick_device(device)
    dtype = torch.float16 if target.type == "cuda" else torch.float32
    config = json.loads((model_dir / "config.json").read_text())
    quant_method = (config.get("quantization_config") or {}).get("quant_method")
    if quant_method == "awq":
        if quantization is not None:
            raise ValueError("the checkpoint is AWQ-quantised already")
        hf_model = load_awq_into_transformers(model_dir, target, dtype)
        kind = "AWQ INT4 (kvdeck W4A16 layers; the AWQ layout, also for round-to-nearest)"
    elif quant_method is None:
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(target).eval()
        kind = f"dense {str(dtype).replace('torch.', '')}"
        if quantization == "bnb-nf4":
            nf4_round_trip(hf_model)
            kind = "NF4 (bitsandbytes, blocks of 64)"
    else:
        raise ValueError(f"cannot evaluate quant_method {quant_method!r}: eval-ppl scores dense and AWQ "
                         "checkpoints (a GPTQ checkpoint runs in the engine: kvdeck --model DIR)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = text_path.read_text(encoding="utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    return perplexity(hf_logits_fn(hf_model), ids, seq_len, max_windows), kind, target.type


@torch.no_grad()
def nf4_round_trip(model: torch.nn.Module) -> None:
    """Replace every decoder-layer linear's weight by its NF4 quantise-dequantise, the values
    kvdeck's bnb-nf4 layers multiply with."""
    from kvdeck.quant.bnb_linear import NF4_BLOCK_SIZE, _bnb

    functional = _bnb().functional
    for layer in model.model.layers:
        for name in LINEAR_NAMES:
            linear = layer.get_submodule(name)
            packed, state = functional.quantize_4bit(linear.weight.data, blocksize=NF4_BLOCK_SIZE,
                                                     quant_type="nf4", compress_statistics=False)
            linear.weight.data = functional.dequantize_4bit(packed, state).to(linear.weight.dtype)
