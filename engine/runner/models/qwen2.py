"""Qwen2 / Qwen2.5: the Llama decoder with a bias on the q/k/v projections."""

from kvdeck.engine.runner.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
