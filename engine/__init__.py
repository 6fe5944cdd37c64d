"""kvdeck's inference engine: paged KV cache, continuous batching, prefix caching."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats, RequestStats

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "Logprob",
    "RequestMetrics",
    "RequestOutput",
    "RequestStats",
    "SamplingParams",
]
