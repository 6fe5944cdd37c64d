"""kvdeck's inference engine: paged KV cache, continuous batching, prefix caching.

Layers, each a sub-package (a layer imports only those below it):
  api/       what callers use: LLM (offline), LLMEngine (sync steps), AsyncLLM (async)
  client/    core clients: in-process, and a supervised subprocess
  frontend/  tokenise, check, detokenise, stop strings      | core/  scheduler, blocks, EngineCore
  runner/    model runner, sampler, decode graphs, loader, models
  types/     light shared types: config, sampling params, outputs, stats, wire messages
This file imports nothing, so `import kvdeck.engine.types...` does not load torch.
"""
