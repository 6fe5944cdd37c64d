"""PEFT LoRA adapters for the tiny random models (tests/model_factory.py), with random
non-zero B (PEFT starts B at zero, which would make every adapter the base), and the
reference: transformers' greedy tokens on the base with the adapter merged in."""

from pathlib import Path

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_adapter(model_dir: Path, out_dir: Path, rank: int = 8, alpha: float = 16,
                  targets: tuple[str, ...] = ALL_TARGETS, seed: int = 1, use_rslora: bool = False) -> Path:
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                        init_lora_weights=False, use_rslora=use_rslora)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # B from a normal law, large enough that the adapter changes tokens
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.2)
    peft_model.save_pretrained(out_dir)
    return out_dir


def merged_greedy(model_dir: Path, adapter_dir: Path | None, prompts: list[list[int]],
                  max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens (EOS ignored) of the base, or of the base with the adapter
    merged (`merge_and_unload`)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()
    model.generation_config.eos_token_id = None
    outputs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones_like(torch.tensor([ids])),
                                 max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
        outputs.append(out[0, len(ids):].tolist())
    return outputs
