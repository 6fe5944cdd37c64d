"""PEFT LoRA adapters on a tiny random model, for the server's adapter tests: random A and B
(PEFT starts B at zero, which would change nothing), saved as PEFT saves them."""

from pathlib import Path


def build_peft_adapter(model_dir: Path, out_dir: Path, seed: int, rank: int = 8,
                       targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj")) -> Path:
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                        init_lora_weights=False, lora_dropout=0.0)
    model = get_peft_model(base, config)
    with torch.no_grad():  # big enough to change greedy tokens of a random model
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
