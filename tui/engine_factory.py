"""Make the real engine client for the TUI (imported lazily: the UI starts without torch).

On the CPU the engine's KV pool is `kv_cache_memory_gib` (1 GiB by default): for the demo
model that is 10,922 blocks, and a 16-request burst fills 1% of the map. Unless the user
sizes the pool, the TUI asks for one that holds a few full-length requests, so paging,
sharing and preemption show on the block map. The engine's own default (server, offline
API) is untouched.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from kvdeck.tui.engine_protocol import ClientFactory, EngineClientProtocol

if TYPE_CHECKING:
    from kvdeck.app.store.cpu_plan import CpuFeatures

POOL_FULL_REQUESTS = 4  # full-length requests the TUI's default CPU pool holds
ENGINE_DEFAULT_POOL_GIB = 1.0  # never ask for more than the engine would take anyway
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
CPU_TOKEN_BUDGET = 2048  # the engine's max_num_batched_tokens on CPU
_SIZED_BY_USER = ("kv_cache_memory_gib", "num_gpu_blocks_override")

logger = logging.getLogger(__name__)


def engine_log_path() -> str:
    """The engine process's output goes here, never into the terminal the TUI draws on."""
    from kvdeck.app.store.paths import data_dir

    logs = data_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return str(logs / "engine.log")


def tui_pool_gib(model_dir: Path, engine_kwargs: dict, cpu: CpuFeatures | None = None) -> float:
    """A CPU KV pool of POOL_FULL_REQUESTS full contexts of the model (at most 1 GiB): as
    many blocks as one full-length request holds at once (a windowed layer group holds
    only its window), at the KV dtype's bytes per block. `cpu`: what this CPU does (default:
    read from /proc/cpuinfo), which decides the engine's dtype for dtype "auto"."""
    from kvdeck.app.store.cpu_plan import cpu_features, engine_cpu_dtype
    from kvdeck.app.store.inspect import read_config
    from kvdeck.engine.types.config import DTYPE_ALIASES
    from kvdeck.engine.types.kv_groups import kv_cache_groups, peak_blocks, slots_per_block
    from kvdeck.engine.types.model_config import read_model_config

    config = read_model_config(model_dir)
    context = int(engine_kwargs.get("max_model_len") or config.max_position_embeddings)
    dtype = str(engine_kwargs.get("dtype") or "auto")
    if dtype == "auto":  # the engine's rule on this CPU (app/store/cpu_plan.py, without torch):
        # bf16 for a bf16 checkpoint, and for an INT4 one where the INT4 kernels run, on a CPU
        # with native bf16; else fp32
        dtype = engine_cpu_dtype(read_config(Path(model_dir)), cpu or cpu_features())
    element = _DTYPE_BYTES[DTYPE_ALIASES[dtype]]
    kv_dtype = str(engine_kwargs.get("kv_cache_dtype") or "auto")
    element = _KV_DTYPE_BYTES.get(kv_dtype, element)
    scale_bytes = 2 if kv_dtype == "int8" else 0  # int8's fp16 scale per (token, head)
    block_size = int(engine_kwargs.get("block_size") or 16)
    groups = kv_cache_groups(config.layer_windows)
    bytes_per_block = (2 * slots_per_block(groups) * config.num_key_value_heads
                       * (config.head_dim * element + scale_bytes) * block_size)
    chunk = int(engine_kwargs.get("max_num_batched_tokens") or CPU_TOKEN_BUDGET)
    blocks = POOL_FULL_REQUESTS * peak_blocks(groups, context, block_size, chunk)
    # Half a block of slack: the engine floors gib * 2**30 / bytes_per_block.
    return min(ENGINE_DEFAULT_POOL_GIB, (blocks + 0.5) * bytes_per_block / 2**30)


def tui_kv_cache_dir(engine_kwargs: dict) -> dict:
    """The TUI keeps the prefix cache on disk across restarts (a saved chat resumes without its
    prefill) under the user cache dir, unless --kv-cache-dir names another folder or 'off'."""
    from kvdeck.app.store.paths import cache_dir

    folder = engine_kwargs.get("kv_cache_dir")
    if folder is None:
        return {**engine_kwargs, "kv_cache_dir": str(cache_dir() / "kv")}
    if str(folder).strip().lower() in KV_CACHE_DIR_OFF:
        return {key: value for key, value in engine_kwargs.items() if key != "kv_cache_dir"}
    return engine_kwargs


KV_CACHE_DIR_OFF = ("off", "none", "")


def tui_engine_kwargs(model: str | None, engine_kwargs: dict) -> dict:
    """The user's engine options, plus a pool sized for the dashboard if they set none, and
    the disk tier's folder (tui_kv_cache_dir)."""
    engine_kwargs = tui_kv_cache_dir(engine_kwargs)
    if any(key in engine_kwargs for key in _SIZED_BY_USER):
        return engine_kwargs
    from kvdeck.engine.types.model_path import resolve_model_path

    try:
        gib = tui_pool_gib(resolve_model_path(model), engine_kwargs)
    except (OSError, ValueError, KeyError) as exc:  # the engine will say what is wrong
        logger.debug("keeping the engine's default KV pool: %s", exc)
        return engine_kwargs
    return {**engine_kwargs, "kv_cache_memory_gib": gib}


def real_client_factory(model: str | None, engine_kwargs: dict) -> ClientFactory:
    def make_client() -> EngineClientProtocol:
        from kvdeck.engine.api.async_llm import AsyncLLM

        return AsyncLLM(model, log_path=engine_log_path(),
                            **tui_engine_kwargs(model, engine_kwargs))

    return make_client
