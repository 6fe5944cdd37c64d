"""Engines are released when asked: building, dropping and rebuilding engines in one
process does not grow its memory, and `shutdown()` frees the model and the KV pool even
while the LLM object is still referenced."""

import gc
import weakref
from pathlib import Path

from kvdeck import LLM, SamplingParams

POOL_GIB = 0.25  # large enough that one leaked pool would show in the RSS


def rss_bytes() -> int:
    fields = Path("/proc/self/status").read_text().split("\n")
    (line,) = [f for f in fields if f.startswith("VmRSS:")]
    return int(line.split()[1]) * 1024


def build_and_run(model_dir: Path) -> None:
    with LLM(str(model_dir), kv_cache_memory_gib=POOL_GIB) as llm:
        llm.generate(["The engine", [5, 6, 7]], SamplingParams(temperature=0, max_tokens=8))


def test_rebuilding_engines_does_not_grow_memory(tiny_llama_dir):
    build_and_run(tiny_llama_dir)  # first build: imports, allocator pools
    build_and_run(tiny_llama_dir)
    gc.collect()
    baseline = rss_bytes()
    for _ in range(4):
        build_and_run(tiny_llama_dir)
    gc.collect()
    growth = rss_bytes() - baseline
    assert growth < 0.25 * POOL_GIB * 2**30, f"RSS grew by {growth / 2**20:.0f} MiB over 4 engines"


def test_shutdown_frees_the_model_and_pool_while_referenced(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    runner = llm.engine.core.runner
    model, k_cache = weakref.ref(runner.model), weakref.ref(runner.k_caches[0])
    gc.disable()  # freed by references dropping, not by a collection that happens to run
    try:
        llm.shutdown()
        assert model() is None and k_cache() is None
    finally:
        gc.enable()
    assert runner.k_caches == [] and runner.decode_graphs is None
