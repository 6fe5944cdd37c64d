"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys, no q/k/v bias."""

from kvdeck.engine.runner.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
