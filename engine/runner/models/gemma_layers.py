"""Pieces of the Gemma 2 and 3 decoders that differ from Llama's: the (1 + weight) RMSNorm,
the GeGLU MLP and the attention with its own score scale, soft cap and per-layer rope."""

import torch
from torch import nn

from kvdeck.engine.runner.models.layers import AttentionMetadata, PagedAttention
from kvdeck.engine.runner.models.linear import Linear, LinearMethod
from kvdeck.engine.runner.models.rotary import RotaryEmbedding
from kvdeck.engine.types.model_config import ModelConfig
from kvdeck.kernels.ops import KernelOps

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


class GemmaRMSNorm(nn.Module):
    """RMSNorm that scales by (1 + weight) and rounds after the product, in fp32 (Llama rounds
    before it); the checkpoint's weight is kept as is and the scale derived once loaded."""

    def __init__(self, size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size), requires_grad=False)
        self.register_buffer("scale", torch.ones(size, dtype=torch.float32), persistent=False)
        self.eps = eps
        self.ops = ops

    def process_weights_after_loading(self) -> None:
        self.scale.copy_(1.0 + self.weight.float())

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.dtype == torch.float32:  # both orders round alike: the kernels' norm serves
            return self.ops.rms_norm(x, self.scale, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        x32 = x.float()
        out = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale).to(x.dtype)
        return out if residual is None else (out, residual)


class GemmaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype) -> None:
        super().__init__()
        activation = cfg.raw.get("hidden_activation") or cfg.raw.get("hidden_act") or GELU_TANH[0]
        if activation not in GELU_TANH:
            raise ValueError(f"Gemma's MLP activation {activation!r} is not supported "
                             f"(supported: {', '.join(GELU_TANH)})")
        size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, [size, size], False, linear_method, dtype, gated=True)
        self.down_proj = Linear(size, [cfg.hidden_size], False, linear_method, dtype)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.act_and_mul(x, "gelu_tanh", self.ops.gelu_tanh_and_mul))


class GemmaAttention(nn.Module):
    """Scores scaled by query_pre_attn_scalar ** -0.5 and soft-capped (Gemma 2); Gemma 3 adds
    per-head q/k norms. A local layer sees its window and may rotate with its own rope."""

    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear_method: LinearMethod, dtype,
                 rotary: RotaryEmbedding, layer_index: int, qk_norm: bool,
                 soft_cap: float | None) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.ops = ops
        self.rotary = rotary
        self.qkv_proj = Linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size],
                               cfg.attention_bias, linear_method, dtype)
        self.o_proj = Linear(self.q_size, [cfg.hidden_size], cfg.attention_bias, linear_method, dtype)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps, ops) if qk_norm else None
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps, ops) if qk_norm else None
        scalar = cfg.raw.get("query_pre_attn_scalar") or cfg.head_dim
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, ops,
                                   sliding_window=cfg.layer_windows[layer_index],
                                   soft_cap=soft_cap,
                                   scale=float(scalar) ** -0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.head_dim))
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.ops.apply_rope(positions, q, k, self.rotary.cos_sin_cache, True)
        out = self.attn(q, k, v, meta)  # a strided view of qkv: the KV write reads it in place
        return self.o_proj(out.reshape(num_tokens, self.q_size))
