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
    """Save a tiny random model of `family` (llama, mistral, qwen2, qwen3, gemma2, gemma3,
    phi3) with a tokenizer; `config_overrides` go into its transformers config."""
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
        **({"sliding_window": None} if family in ("mistral", "phi3") else {}),
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
    elif family in ("gemma2", "gemma3"):
        config, cls = _gemma_config(family, common)
    elif family == "phi3":
        config = tf.Phi3Config(**{"rope_parameters": PHI3_LONGROPE, "partial_rotary_factor": 0.75,
                                  "original_max_position_embeddings": 64, **common})
        cls = tf.Phi3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(config).eval()
    if family.startswith("gemma"):
        # Gemma's norms start at zero (a scale of 1 + 0): with tied embeddings the residual
        # stream then just echoes the input token. Random norms make it say something, and
        # test the 1 + weight.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight") and "_norm" not in name.split(".")[-2]:
                    param.copy_(torch.randn_like(param))
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id})
    )
    return out_dir


# LongRoPE on a 16-wide head rotating 12 dims: 6 factors each, the long ones far from 1 so
# positions past the original 64 rotate visibly otherwise.
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0],
                 "long_factor": [1.0, 1.5, 2.5, 4.0, 8.0, 16.0]}


def _gemma_config(family: str, common: dict):
    """Gemma with every feature switched on: a local window on alternate layers, a score
    scale other than head_dim's, soft caps small enough to bite, and (Gemma 3) a linear-
    scaled global rope beside the local one. Untied unless asked: tied tiny random Gemmas
    mostly repeat one token, which would make greedy equality a weak test."""
    import transformers as tf

    window = common.pop("sliding_window", 16)
    layers = common["num_hidden_layers"]
    gemma = dict({"tie_word_embeddings": False, **common}, head_dim=16, query_pre_attn_scalar=24,
                 sliding_window=window, hidden_activation="gelu_pytorch_tanh",
                 layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(layers)])
    if family == "gemma2":
        config = tf.Gemma2Config(**{"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                    **gemma})
        return config, tf.Gemma2ForCausalLM
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    config = tf.Gemma3TextConfig(**{"rope_parameters": rope, "attn_logit_softcapping": 2.0,
                                    "final_logit_softcapping": 3.0, **gemma})
    return config, tf.Gemma3ForCausalLM


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
