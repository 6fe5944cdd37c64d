"""Llama-family decoder (Llama 2/3/3.x, Mistral). Qwen2 and Qwen3 reuse it with flags:
bias on q/k/v (Qwen2) and per-head RMSNorm on q and k (Qwen3)."""

import torch
from torch import nn

from kvdeck.engine.runner.models.layers import AttentionMetadata, PagedAttention, RMSNorm
from kvdeck.engine.runner.models.linear import Linear, LinearMethod
from kvdeck.engine.runner.models.rotary import RotaryEmbedding
from kvdeck.engine.types.model_config import ModelConfig
from kvdeck.kernels.cpu.decode_stack import DecoderStack, token_contexts
from kvdeck.kernels.ops import KernelOps


class LlamaAttention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        ops: KernelOps,
        linear_method: LinearMethod,
        dtype: torch.dtype,
        qkv_bias: bool,
        qk_norm: bool,
        rotary: RotaryEmbedding,
        layer_index: int = 0,
    ) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.ops = ops
        self.rotary = rotary
        self.qkv_proj = Linear(
            cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], qkv_bias, linear_method, dtype
        )
        self.o_proj = Linear(self.q_size, [cfg.hidden_size], False, linear_method, dtype)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, ops) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, ops) if qk_norm else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, ops,
                                   sliding_window=cfg.layer_windows[layer_index])

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.ops.qk_norm_rope_kv_write is not None and not torch.compiler.is_compiling():
            # q/k norm + RoPE + KV write in one launch, in place on the strided qkv views.
            out = self.attn.forward_fused(
                positions, q.view(num_tokens, self.num_heads, self.head_dim),
                k.view(num_tokens, self.num_kv_heads, self.head_dim),
                v.view(num_tokens, self.num_kv_heads, self.head_dim),
                self.rotary.cos_sin_cache, True, meta, self.q_norm, self.k_norm)
            return self.o_proj(out.reshape(num_tokens, self.q_size))
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.head_dim))
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.ops.apply_rope(positions, q, k, self.rotary.cos_sin_cache, True)
        out = self.attn(q, k, v, meta)  # a strided view of qkv: the KV write reads it in place
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, [size, size], False, linear_method, dtype, gated=True)
        self.down_proj = Linear(size, [cfg.hidden_size], False, linear_method, dtype)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.act_and_mul(x, "silu", self.ops.silu_and_mul))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype,
                 qkv_bias: bool, qk_norm: bool, rotary: RotaryEmbedding, layer_index: int = 0) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, ops, linear_method, dtype, qkv_bias, qk_norm, rotary,
                                        layer_index)
        self.mlp = LlamaMLP(cfg, ops, linear_method, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)

    def forward(self, positions, hidden, residual, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype,
                 qkv_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        rotary = RotaryEmbedding(rotary_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                 cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, ops, linear_method, dtype, qkv_bias, qk_norm, rotary, i)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.rotary = rotary
        # Every layer of a step of a few tokens in one native call, where it applies (bound
        # by the runner with the KV cache: engine/runner/models/native_decode.py).
        self.decoder_stack: DecoderStack | None = None

    def forward(self, input_ids, positions, meta):
        hidden = self.embed_tokens(input_ids)
        stack = self.decoder_stack
        if stack is not None and stack.takes(hidden):  # bound only with one KV group
            tables, lens = meta.block_tables, meta.seq_lens
            if meta.max_query_len > 1:  # a short chunk (a speculative verify): one row a token
                tables, lens = token_contexts(meta.query_start_loc, lens, tables)
            hidden, residual = stack.run(hidden, positions, self.rotary.cos_sin_cache, meta.slot_mapping,
                                         tables, lens)
            if stack.final_norm is not None:  # it ended with this model's norm (native_decode)
                return hidden
        else:
            residual = None
            for layer in self.layers:
                hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False
    # Checkpoint projection name -> (merged layer, shard index).
    packed_modules = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype) -> None:
        super().__init__()
        qkv_bias = self.qkv_bias or cfg.attention_bias
        self.config = cfg
        self.model = LlamaModel(cfg, ops, linear_method, dtype, qkv_bias, self.qk_norm)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
