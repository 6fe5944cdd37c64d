"""Tiny GGUF files written in the test, as llama.cpp's converter would write them.

A tiny transformers model (random weights, the byte-level BPE tokenizer of model_factory)
is converted with the `gguf` package's writer: llama.cpp's tensor names, its q/k row
permutation for Llama, the tokenizer as tokenizer.ggml.* metadata with the chat template,
and weights quantised with `gguf.quants.quantize`. The package cannot quantise to the
K-quants, so those tensors are random but valid blocks: the model is whatever they
dequantise to, which is all a token-for-token comparison needs.
"""

import json
from pathlib import Path

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
    TokenType,
    get_tensor_name_map,
)
from gguf.quants import quantize
from safetensors.torch import load_file

from tests.model_factory import CHAT_TEMPLATE, build_tokenizer

Q = GGMLQuantizationType
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
_ARCHS = {"llama": MODEL_ARCH.LLAMA, "qwen2": MODEL_ARCH.QWEN2, "qwen3": MODEL_ARCH.QWEN3}
_FILE_TYPES = {Q.F32: LlamaFileType.ALL_F32, Q.F16: LlamaFileType.MOSTLY_F16,
               Q.BF16: LlamaFileType.MOSTLY_BF16, Q.Q8_0: LlamaFileType.MOSTLY_Q8_0,
               Q.Q4_0: LlamaFileType.MOSTLY_Q4_0, Q.Q4_1: LlamaFileType.MOSTLY_Q4_1,
               Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_M, Q.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
               Q.Q6_K: LlamaFileType.MOSTLY_Q6_K}  # fmt: skip


def build_hf_model(out_dir: Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    """A tiny random model saved in float32; rows of 256 so every quant type fits."""
    import transformers as tf

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    kwargs = dict(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.1, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    kwargs.update(overrides)
    config_class, cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                         "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
                         "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[family]  # fmt: skip
    config = config_class(**kwargs)
    torch.manual_seed(seed)
    cls(config).eval().save_pretrained(out_dir)
    return out_dir


def write_gguf(
    hf_dir: Path,
    out: Path,
    qtype: GGMLQuantizationType,
    *,
    family: str = "llama",
    types: dict[str, GGMLQuantizationType] | None = None,
    name: str = "Tiny Test Model",
    rope_freqs: np.ndarray | None = None,
    seed: int = 0,
    add_bos: bool = False,
) -> Path:
    """Convert the model in `hf_dir` to GGUF; 2-D weights in `qtype` (or `types[gguf_name]`)."""
    config = json.loads((hf_dir / "config.json").read_text())
    state = load_file(hf_dir / "model.safetensors")
    writer = GGUFWriter(out, family)
    _write_metadata(writer, config, hf_dir, name, _FILE_TYPES[qtype], add_bos)
    names = get_tensor_name_map(_ARCHS[family], config["num_hidden_layers"])
    rng = np.random.default_rng(seed)
    for hf_name in sorted(state):
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        data = state[hf_name].float().numpy()
        if family == "llama" and ".attn_q." in gguf_name:
            data = _permute(data, config["num_attention_heads"], config["num_attention_heads"])
        elif family == "llama" and ".attn_k." in gguf_name:
            data = _permute(data, config["num_attention_heads"], config["num_key_value_heads"])
        kind = (types or {}).get(gguf_name, qtype) if data.ndim == 2 else Q.F32
        _add_tensor(writer, gguf_name, data, kind, rng)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def hf_gguf_greedy(gguf_path, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Reference: transformers loading the same GGUF (its own dequantisation), float32, greedy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch.float32).eval()  # fmt: skip
    model.generation_config.eos_token_id = None
    outputs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones_like(torch.tensor([ids])),
                                 max_new_tokens=max_new, do_sample=False, pad_token_id=0)  # fmt: skip
        outputs.append(out[0, len(ids):].tolist())
    return outputs


def write_header_only_gguf(out: Path, architecture: str) -> Path:
    """A GGUF of an architecture kvdeck does not import (one tensor, no tokenizer)."""
    writer = GGUFWriter(out, architecture)
    writer.add_name(f"tiny {architecture}")
    writer.add_block_count(1)
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_metadata(writer: GGUFWriter, config: dict, hf_dir: Path, name: str, file_type,
                    add_bos: bool) -> None:  # fmt: skip
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_name(name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)  # llama.cpp states it for Qwen3, whose head_dim is its own
    writer.add_value_length(head_dim)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(file_type)
    _write_tokenizer(writer, hf_dir, add_bos)


def _write_tokenizer(writer: GGUFWriter, hf_dir: Path, add_bos: bool = False) -> None:
    data = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(data["model"]["vocab"])
    special = set()
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
        if added["special"]:
            special.add(added["content"])
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[config["bos_token"]])
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)


def _add_tensor(writer: GGUFWriter, name: str, data: np.ndarray, kind, rng) -> None:
    if kind == Q.F32:
        writer.add_tensor(name, data.astype(np.float32))
    elif kind == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif kind in K_QUANTS:
        writer.add_tensor(name, random_blocks(kind, data.shape, rng), raw_dtype=kind)
    elif kind == Q.Q8_1:  # a type nothing here reads (nor quantises to): its bytes do not matter
        block, size = GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 256, size=(data.shape[0], data.shape[1] // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=kind)
    else:
        writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)


def random_blocks(kind: GGMLQuantizationType, shape: tuple[int, ...], rng) -> np.ndarray:
    """Valid K-quant blocks with random quants and scales, and small fp16 super-block scales."""
    block, size = GGML_QUANT_SIZES[kind]
    rows, cols = shape
    blocks = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    if kind == Q.Q6_K:  # signed quants; d comes last
        blocks[..., -2:] = np.frombuffer(np.float16(2e-5).tobytes(), dtype=np.uint8)
    else:  # unsigned quants minus dmin * min: d and dmin come first, dmin picked to centre them
        d, dmin = (2e-4, 1.5e-3) if kind == Q.Q4_K else (1e-4, 1.5e-3)
        blocks[..., :4] = np.frombuffer(np.array([d, dmin], dtype=np.float16).tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, cols // block * size)


def llama3_rope_freqs(config: dict) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes for Llama 3 rope scaling."""
    rope = config["rope_parameters"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inv_freq = 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factors = []
    for freq in inv_freq:
        wavelen = 2 * np.pi / freq
        context = rope["original_max_position_embeddings"]
        low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
        if wavelen < context / high:
            factors.append(1.0)
        elif wavelen > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's converter's row order for q and k (rotary pairs interleaved per head)."""
    if n_head != n_head_kv:
        n_head = n_head_kv
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
