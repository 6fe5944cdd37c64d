"""kvdeck's inference engine: paged KV cache, continuous batching, prefix caching.

Names are imported on first use, so `import engine.sampling_params` (the UI process does)
does not load torch and the model code.
"""

import importlib

_EXPORTS = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.sampling_params",
    "CompletionOutput": "engine.outputs",
    "Logprob": "engine.outputs",
    "RequestMetrics": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "EngineStats": "engine.stats",
    "RequestStats": "engine.stats",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
