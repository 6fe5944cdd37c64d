"""Speculative decoding in the core: proposers (n-gram lookup, a draft model), the
per-request policy, and the `SpeculativeDecoder` the EngineCore drives each step."""
