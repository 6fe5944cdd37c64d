"""Gemma 2 and Gemma 3 (text): embeddings scaled by sqrt(hidden_size), GeGLU MLPs, a norm
before and after both the attention and the MLP, attention and final-logit soft caps,
local (sliding-window) layers alternating with global ones, query_pre_attn_scalar; Gemma 3
adds q/k norms and a rope of its own for the local layers."""

import math

import torch
from torch import nn

from kvdeck.engine.runner.models.gemma_layers import GemmaAttention, GemmaMLP, GemmaRMSNorm
from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.runner.models.linear import LinearMethod
from kvdeck.engine.runner.models.llama import LlamaForCausalLM
from kvdeck.engine.runner.models.rotary import RotaryEmbedding
from kvdeck.engine.types.model_config import ModelConfig
from kvdeck.kernels.ops import KernelOps


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype,
                 rotary: RotaryEmbedding, layer_index: int, qk_norm: bool,
                 soft_cap: float | None) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(cfg, ops, linear_method, dtype, rotary, layer_index, qk_norm,
                                        soft_cap)
        self.mlp = GemmaMLP(cfg, ops, linear_method, dtype)
        size, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps, ops)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps, ops)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps, ops)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps, ops)

    def forward(self, positions, hidden, residual, meta):
        # The residual adds are fused into the next norm, as in the Llama decoder.
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, meta))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class GemmaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype,
                 qk_norm: bool, soft_cap: float | None) -> None:
        super().__init__()
        max_positions = cfg.max_position_embeddings
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.local_rotary = (RotaryEmbedding(cfg.head_dim, max_positions, *cfg.local_rope)
                             if cfg.local_rope else self.rotary)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        # sqrt(hidden_size) rounded to the model's dtype first, as transformers does.
        self.normalizer = float(torch.tensor(math.sqrt(cfg.hidden_size), dtype=dtype))
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, ops, linear_method, dtype,
                              self.rotary if cfg.layer_windows[i] is None else self.local_rotary,
                              i, qk_norm, soft_cap)
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)

    def forward(self, input_ids, positions, meta):
        hidden = self.embed_tokens(input_ids) * self.normalizer
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Gemma2ForCausalLM(nn.Module):
    qk_norm = False
    # Gemma 3's config keeps attn_logit_softcapping, but transformers' Gemma 3 no longer
    # caps the scores (its checkpoints leave it unset); only Gemma 2 does.
    caps_scores = True
    packed_modules = LlamaForCausalLM.packed_modules

    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype) -> None:
        super().__init__()
        self.config = cfg
        soft_cap = cfg.raw.get("attn_logit_softcapping") if self.caps_scores else None
        self.model = GemmaModel(cfg, ops, linear_method, dtype, self.qk_norm, soft_cap)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.final_soft_cap = cfg.raw.get("final_logit_softcapping")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.final_soft_cap:
            logits = torch.tanh(logits / self.final_soft_cap) * self.final_soft_cap
        return logits


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True
    caps_scores = False
