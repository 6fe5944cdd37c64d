"""Phi-3, Phi-3.5 and Phi-4-mini: the Llama decoder as checkpoints store it fused (qkv_proj
and gate_up_proj load whole into kvdeck's merged layers), rotating `partial_rotary_factor`
of each head with LongRoPE's short and long factors (`engine/runner/models/rotary.py`)."""

from kvdeck.engine.runner.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    # The checkpoint's names are the merged layers' own: nothing to map.
    packed_modules: dict[str, tuple[str, int]] = {}
