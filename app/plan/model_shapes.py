"""A model's shape for planning: parameter count, weight bytes by quantisation, KV bytes per
token by KV dtype, FLOPs per token. Named shapes (from the models' config.json on the hub),
or a local model's config.json (a directory, a bare config.json, a hub id in the cache),
read without torch and without downloading anything."""

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.engine.types.arith import cdiv
from kvdeck.engine.types.kv_groups import KVCacheGroup, kv_cache_groups, slots_per_block
from kvdeck.engine.types.model_config import ModelConfig, read_model_config
from kvdeck.engine.types.model_path import resolve_model_path

# Bytes per weight of a quantised linear layer: INT4 with a 16-bit scale and a 4-bit zero per
# group of 128 (AutoAWQ GEMM, GPTQ), INT8 with a 16-bit scale per output channel (~0).
# Embeddings and norms stay 16-bit, as those checkpoints ship them.
LINEAR_BYTES = {"bf16": 2.0, "fp16": 2.0, "awq": 0.5 + 2.5 / 128, "gptq": 0.5 + 2.5 / 128,
                "int8": 1.0}
# Bytes per weight of the output head as the engine serves it: an INT4 model's in int8 with a
# 16-bit scale per 32 (quant/int8_head.py, the CPU's likewise; a tied head is then a copy
# beside the 16-bit embedding), an INT8 model's per channel, the rest 16-bit.
HEAD_BYTES = {"bf16": 2.0, "fp16": 2.0, "awq": 1 + 2 / 32, "gptq": 1 + 2 / 32, "int8": 1.0}
QUANTS = tuple(LINEAR_BYTES)
# Bytes per (token, head) element of K or V, plus any scale per (token, head) (int8: fp16).
KV_DTYPES = {"auto": (2, 0), "bf16": (2, 0), "fp16": (2, 0), "fp8": (1, 0), "int8": (1, 2),
             # the engine's spellings (--kv-cache-dtype) too
             "bfloat16": (2, 0), "float16": (2, 0), "fp8_e4m3": (1, 0), "fp8_e5m2": (1, 0)}


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    # Per layer, the keys a query sees (None: all); empty means every layer sees all.
    layer_windows: tuple[int | None, ...] = field(default=())

    @property
    def linear_params_per_layer(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def linear_params(self) -> int:
        return self.num_layers * self.linear_params_per_layer

    @property
    def embedding_params(self) -> int:
        """The input embedding and the output head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        return self.linear_params + self.embedding_params

    def weight_bytes(self, quant: str) -> int:
        if quant not in LINEAR_BYTES:
            raise ValueError(f"unknown quantisation {quant!r}; known: {', '.join(QUANTS)}")
        matrix = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings and HEAD_BYTES[quant] == 2 else matrix * HEAD_BYTES[quant]
        return int(self.linear_params * LINEAR_BYTES[quant] + matrix * 2 + head)

    def weight_bytes_per_step(self, quant: str) -> int:
        """Weights a step reads: every linear layer, the output head, not the embedding table
        (a step gathers a few of its rows)."""
        head = self.vocab_size * self.hidden_size * HEAD_BYTES[quant]
        return int(self.linear_params * LINEAR_BYTES[quant] + head)

    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the linear layers and the output head
        (attention's part depends on the context: attention_flops)."""
        return 2 * (self.linear_params + self.vocab_size * self.hidden_size)

    def attention_flops(self, query_key_pairs: int) -> int:
        """QK^T and PV over every layer for `query_key_pairs` (query, key) pairs."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * query_key_pairs

    @property
    def windows(self) -> list[int | None]:
        return list(self.layer_windows) or [None] * self.num_layers

    def kv_groups(self) -> list[KVCacheGroup]:
        return kv_cache_groups(self.windows)

    def kv_bytes_per_block(self, block_size: int, kv_dtype: str) -> int:
        """One block of the shared pool over every layer slot (engine/runner/kv_pool.py)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
        element, scale = KV_DTYPES[kv_dtype]
        per_token_head = element * self.head_dim + scale
        return 2 * slots_per_block(self.kv_groups()) * block_size * self.num_kv_heads * per_token_head

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V of one token in every layer (what attention reads per context token)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}")
        element, scale = KV_DTYPES[kv_dtype]
        return 2 * self.num_layers * self.num_kv_heads * (element * self.head_dim + scale)

    def blocks_per_context(self, num_tokens: int, block_size: int) -> int:
        """Blocks one request of `num_tokens` holds at the end (windowed groups hold a window)."""
        total = 0
        for group in self.kv_groups():
            tokens = num_tokens if group.window is None else min(num_tokens, group.window)
            total += cdiv(tokens, block_size)
        return total


def _shape(name, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tied, max_pos,
           windows=()) -> ModelShape:
    return ModelShape(name, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tied, max_pos,
                      tuple(windows))


def _alternating(num_layers: int, window: int, every: int) -> tuple[int | None, ...]:
    """Every `every`-th layer global, the rest with a sliding window (Gemma 2: every 2nd,
    Gemma 3: every 6th)."""
    return tuple(None if (i + 1) % every == 0 else window for i in range(num_layers))


# From each model's config.json on the Hugging Face hub.
NAMED_SHAPES = {shape.name: shape for shape in (
    _shape("Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, True, 40960),
    _shape("Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936, True, 40960),
    _shape("Qwen3-4B", 2560, 36, 32, 8, 128, 9728, 151936, True, 40960),
    _shape("Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, False, 40960),
    _shape("Qwen3-14B", 5120, 40, 40, 8, 128, 17408, 151936, False, 40960),
    _shape("Qwen3-32B", 5120, 64, 64, 8, 128, 25600, 151936, False, 40960),
    _shape("Qwen2.5-7B", 3584, 28, 28, 4, 128, 18944, 152064, False, 32768),
    _shape("Llama-3.2-1B", 2048, 16, 32, 8, 64, 8192, 128256, True, 131072),
    _shape("Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, True, 131072),
    _shape("Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256, False, 131072),
    _shape("Mistral-7B", 4096, 32, 32, 8, 128, 14336, 32768, False, 32768),
    _shape("Gemma-2-9B", 3584, 42, 16, 8, 256, 14336, 256000, True, 8192, _alternating(42, 4096, 2)),
    _shape("Gemma-3-12B", 3840, 48, 16, 8, 256, 15360, 262208, True, 131072,
           _alternating(48, 1024, 6)),
    _shape("SmolLM2-135M", 576, 30, 9, 3, 64, 1536, 49152, True, 8192),
)}


def shape_from_config(config: ModelConfig, name: str) -> ModelShape:
    return ModelShape(name, config.hidden_size, config.num_hidden_layers,
                      config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                      config.intermediate_size, config.vocab_size, config.tie_word_embeddings,
                      config.max_position_embeddings, tuple(config.layer_windows))


def find_model_shape(model: str) -> ModelShape:
    """A named shape (case-insensitive), or a local model's config.json; ValueError naming the
    known shapes when it is neither."""
    by_lower = {name.lower(): shape for name, shape in NAMED_SHAPES.items()}
    key = model.lower().split("/")[-1].removesuffix("-instruct").removesuffix("-awq")
    if key in by_lower:
        return by_lower[key]
    path = Path(model).expanduser()
    looks_local = path.exists() or model == "demo" or model.count("/") == 1
    if looks_local:
        try:
            model_dir = resolve_model_path(model)
            return shape_from_config(read_model_config(model_dir), model)
        except (ValueError, OSError, KeyError) as exc:
            if path.exists() or model == "demo":
                raise ValueError(f"cannot read the shape of model {model!r}: {exc}") from None
    close = difflib.get_close_matches(model, list(NAMED_SHAPES), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown model {model!r}{hint}; known shapes: {', '.join(NAMED_SHAPES)}; "
                     "or give a local model directory, its config.json, or a hub id already "
                     "downloaded (kvdeck pull ID)")
