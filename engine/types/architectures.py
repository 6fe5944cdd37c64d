"""The architectures (config.json's `architectures[0]`) kvdeck runs, by model family file.

Light, so the model store can say "supported" without importing the models;
`kvdeck.engine.runner.models` maps each family to its class.
"""

ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_FAMILIES)
