"""kvdeck's inference engine: paged KV cache, continuous batching, prefix caching.

Layers, each a sub-package (a layer imports only those below it):
  api/          what callers use: LLM (offline), LLMEngine (sync steps), AsyncLLM (async)
  core_client/  how a front-end reaches the core (types/core_client.py): in-process, or a
                supervised subprocess
  frontend/     tokenise, check, fan out n choices, detokenise, stop strings
  core/         scheduler, blocks, EngineCore (beside frontend/, not below it)
  runner/       model runner, sampler, decode graphs, loader, models
  types/        light shared types: config, sampling params, outputs, stats, wire messages
This file imports nothing, so `import kvdeck.engine.types...` does not load torch.
"""
