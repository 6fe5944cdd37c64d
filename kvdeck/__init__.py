"""kvdeck: a local LLM engine with a live view of its paged KV cache.

The offline API is vLLM's: `from kvdeck import LLM, SamplingParams`. Names are imported
on first use, so `import kvdeck` (the UI and server processes do) does not load torch.
"""

import importlib

# Quantisation methods register themselves with the engine's registry (the engine does
# not import kvdeck.quant); this import is light, the methods load torch only when built.
import kvdeck.quant  # noqa: F401

_EXPORTS = {
    "LLM": "kvdeck.engine.api.llm",
    "LLMEngine": "kvdeck.engine.api.llm_engine",
    "EngineConfig": "kvdeck.engine.types.config",
    "SamplingParams": "kvdeck.engine.types.sampling_params",
    "CompletionOutput": "kvdeck.engine.types.outputs",
    "Logprob": "kvdeck.engine.types.outputs",
    "RequestMetrics": "kvdeck.engine.types.outputs",
    "RequestOutput": "kvdeck.engine.types.outputs",
    "BeamSearchParams": "kvdeck.engine.types.beam_search",
    "BeamSearchOutput": "kvdeck.engine.types.beam_search",
    "BeamSearchSequence": "kvdeck.engine.types.beam_search",
    "LoRARequest": "kvdeck.engine.types.lora",
    "TextPrompt": "kvdeck.engine.types.prompts",
    "TokensPrompt": "kvdeck.engine.types.prompts",
    "EngineStats": "kvdeck.engine.types.stats",
    "RequestStats": "kvdeck.engine.types.stats",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvdeck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
