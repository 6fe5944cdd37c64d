"""Tiny random Hugging Face models with a real (byte-level BPE) tokenizer, built offline."""

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching schedules requests at every iteration.",
    "Prefix caching reuses blocks that hold the same tokens.",
    "Héllo wörld, ça va? 日本語のテキスト and emoji 🙂 too.",
    "def add(a, b):\n    return a + b\n",
] * 20


def build_tokenizer(out_dir: Path, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[2:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_model(out_dir: Path, family: str, seed: int = 0, **config_overrides) -> Path:
    """Save a tiny random model of `family` (llama, mistral, qwen2, qwen3) with a tokenizer;
    `config_overrides` go into its transformers config."""
    import transformers as tf

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.15,
        **({"sliding_window": None} if family == "mistral" else {}),
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    common.update(config_overrides)
    if family == "llama":
        config = tf.LlamaConfig(
            **common,
            rope_parameters={
                "rope_type": "llama3", "rope_theta": 50000.0, "factor": 4.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        cls = tf.LlamaForCausalLM
    elif family == "mistral":
        config = tf.MistralConfig(**common)
        cls = tf.MistralForCausalLM
    elif family == "qwen2":
        config = tf.Qwen2Config(**common)
        cls = tf.Qwen2ForCausalLM
    elif family == "qwen3":
        config = tf.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
        cls = tf.Qwen3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id})
    )
    return out_dir


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Reference: transformers `generate`, greedy, one prompt at a time, EOS ignored."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        outputs.append(out[0, len(ids):].tolist())
    return outputs
