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

from kvdeck.tui.engine_protocol import ClientFactory, EngineClientProtocol

POOL_FULL_REQUESTS = 4  # full-length requests the TUI's default CPU pool holds
ENGINE_DEFAULT_POOL_GIB = 1.0  # never ask for more than the engine would take anyway
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_SIZED_BY_USER = ("kv_cache_memory_gib", "num_gpu_blocks_override")

logger = logging.getLogger(__name__)


def engine_log_path() -> str:
    """The engine process's output goes here, never into the terminal the TUI draws on."""
    from kvdeck.app.store.paths import data_dir

    logs = data_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return str(logs / "engine.log")


def tui_pool_gib(model_dir: Path, engine_kwargs: dict) -> float:
    """A CPU KV pool of POOL_FULL_REQUESTS full contexts of the model (at most 1 GiB)."""
    from kvdeck.engine.types.config import DTYPE_ALIASES
    from kvdeck.engine.types.model_config import read_model_config

    config = read_model_config(model_dir)
    context = int(engine_kwargs.get("max_model_len") or config.max_position_embeddings)
    if config.sliding_window is not None:
        context = min(context, config.sliding_window)
    dtype = str(engine_kwargs.get("dtype") or "auto")
    element = _DTYPE_BYTES[DTYPE_ALIASES[dtype]] if dtype != "auto" else 4  # auto: fp32 on CPU
    block_size = int(engine_kwargs.get("block_size") or 16)
    bytes_per_block = (2 * config.num_hidden_layers * config.num_key_value_heads
                       * config.head_dim * element * block_size)
    blocks = POOL_FULL_REQUESTS * -(-context // block_size)
    # Half a block of slack: the engine floors gib * 2**30 / bytes_per_block.
    return min(ENGINE_DEFAULT_POOL_GIB, (blocks + 0.5) * bytes_per_block / 2**30)


def tui_engine_kwargs(model: str | None, engine_kwargs: dict) -> dict:
    """The user's engine options, plus a pool sized for the dashboard if they set none."""
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
        from kvdeck.engine.api.async_client import EngineClient

        return EngineClient(model, log_path=engine_log_path(),
                            **tui_engine_kwargs(model, engine_kwargs))

    return make_client
