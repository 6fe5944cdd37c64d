"""The bundled demo model (assets/demo_model): its files, format, chat template and quality."""

from __future__ import annotations

import json
import math
import string

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvdeck.engine.types.model_path import demo_model_dir

MODEL_DIR = demo_model_dir()
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json", "MODEL_CARD.md",
                  "heldout.txt")
MAX_WEIGHTS_BYTES = 16 * 1024 * 1024
# Uniform guessing over the vocabulary scores ppl = vocab size (4096). The shipped model scores
# about 116 on heldout.txt (plain docstrings of modules it never saw; MODEL_CARD.md), so the bound
# leaves room for retraining noise while staying over 20x below uniform.
HELDOUT_PPL_BOUND = 180.0
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((MODEL_DIR / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()


def test_files_exist_and_weights_are_small():
    missing = [name for name in REQUIRED_FILES if not (MODEL_DIR / name).is_file()]
    assert not missing, f"missing in {MODEL_DIR}: {missing}"
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= MAX_WEIGHTS_BYTES


def test_config_is_a_gqa_llama_that_awq_can_quantise(config):
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert config["head_dim"] == 64
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    # AWQ groups of 128 along every linear layer's input features.
    assert config["hidden_size"] % 128 == 0 and config["intermediate_size"] % 128 == 0
    assert config["max_position_embeddings"] >= 512
    assert config["dtype"] in ("float16", "bfloat16")
    assert config.get("torch_dtype", config["dtype"]) == config["dtype"]


def test_weights_use_hugging_face_llama_names(config):
    with safe_open(MODEL_DIR / "model.safetensors", "pt") as f:
        names = set(f.keys())
        dtypes = {f.get_tensor(n).dtype for n in names}
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        expected |= {prefix + f"self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {prefix + f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {prefix + "input_layernorm.weight", prefix + "post_attention_layernorm.weight"}
    if not config["tie_word_embeddings"]:
        expected.add("lm_head.weight")
    assert names == expected
    assert dtypes == {getattr(torch, config["dtype"])}


def test_tokenizer_matches_model_and_round_trips_bytes(tokenizer, config):
    assert len(tokenizer) == config["vocab_size"]
    assert tokenizer.bos_token == "<s>" and tokenizer.eos_token == "</s>"
    assert tokenizer.pad_token_id is not None
    assert tokenizer.eos_token_id == config["eos_token_id"]
    gen = json.loads((MODEL_DIR / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tokenizer.eos_token_id
    text = "def naïve(x):\n    return x → ✓ 日本語\t"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id  # a plain prompt gets bos, as Llama's tokenizers do
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders_roles_and_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What does json.dumps do?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ("<s><|system|>\nBe brief.</s><|user|>\nWhat does json.dumps do?</s>"
                        "<|assistant|>\n")
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    role_ids = tokenizer.convert_tokens_to_ids(list(ROLE_TOKENS))
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert [i for i in ids if i in role_ids] == role_ids  # each marker is one special token
    without = tokenizer.apply_chat_template(messages, tokenize=False)
    assert not without.endswith("<|assistant|>\n")


def test_assistant_turn_ends_with_eos(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered.endswith("<|assistant|>\nHello.</s>")


def test_chat_template_rejects_unknown_role(tokenizer):
    with pytest.raises(Exception, match="Unknown role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@torch.no_grad()
def test_heldout_perplexity_is_far_below_uniform(model, tokenizer, config):
    ids = tokenizer((MODEL_DIR / "heldout.txt").read_text())["input_ids"]
    seq_len = config["max_position_embeddings"]
    n = len(ids) // seq_len * seq_len
    assert n >= seq_len, "heldout.txt must hold at least one full window"
    windows = torch.tensor(ids[:n]).view(-1, seq_len)
    loss = model(input_ids=windows, labels=windows).loss.item()
    ppl = math.exp(loss)
    assert HELDOUT_PPL_BOUND < config["vocab_size"] / 20
    assert ppl < HELDOUT_PPL_BOUND, f"held-out perplexity {ppl:.1f}"


@torch.no_grad()
def test_greedy_chat_answer_is_readable_text(model, tokenizer):
    messages = [{"role": "user", "content": "What does json.dumps do?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    x = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=40,
                         do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(out[0, x.shape[1]:], skip_special_tokens=True)
    words = answer.split()
    assert len(words) >= 5, repr(answer)
    printable = sum(c in string.printable for c in answer) / len(answer)
    assert printable > 0.95, repr(answer)
    # Mostly real words: letters, not a soup of punctuation.
    alpha_words = [w for w in words if sum(c.isalpha() for c in w) >= len(w) / 2]
    assert len(alpha_words) >= len(words) / 2, repr(answer)
