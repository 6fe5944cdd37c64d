"""Start-up of the prefix cache's host and disk tiers (`kv_tiers.py`) and what they add to
the engine's stats snapshot."""

import logging
from pathlib import Path

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.kv_disk_store import DiskBlockStore
from kvdeck.engine.core.kv_fingerprint import model_fingerprint
from kvdeck.engine.core.kv_tiers import KVTiers
from kvdeck.engine.runner.kv_block_copy import KVBlockCopier
from kvdeck.engine.runner.kv_tier_io import KVTierIO
from kvdeck.engine.runner.model_runner import ModelRunner
from kvdeck.engine.types.config import EngineConfig

logger = logging.getLogger(__name__)
GIB = 2**30


def build_kv_tiers(config: EngineConfig, runner: ModelRunner, model_dir: Path,
                   block_manager: BlockManager) -> KVTiers | None:
    """The tiers the config asks for, wired to the block manager and the runner; None when it
    asks for none, or (with a warning that says why) when this engine cannot use them."""
    if not config.kv_offload_gib and config.kv_cache_dir is None:
        return None
    why_not = _unsupported(config, block_manager)
    if why_not:
        logger.warning("the prefix cache's host and disk tiers are off: %s", why_not)
        return None
    copier = KVBlockCopier.from_pool(runner.kv_pool)
    block_bytes = copier.block_bytes
    host_rows = int(config.kv_offload_gib * GIB) // block_bytes
    if config.kv_offload_gib and not host_rows:
        raise ValueError(f"kv_offload_gib={config.kv_offload_gib} holds no KV block of this model "
                         f"({block_bytes} bytes); raise it or set 0")
    part_sizes = [row.shape[1] for row in copier.rows]
    fingerprint = model_fingerprint(
        model_dir, dtype=str(runner.dtype).removeprefix("torch."), kv_format=runner.kv_pool.format.name,
        block_size=config.block_size, part_sizes=part_sizes, load_format=config.load_format,
        seed=config.seed, quantization=config.quantization)
    disk = None
    if config.kv_cache_dir is not None:
        disk = DiskBlockStore(Path(config.kv_cache_dir), fingerprint, part_sizes,
                              int(config.kv_cache_dir_gib * GIB))
        logger.info("KV disk tier: %s (%d blocks of this model, %.2f of %.2f GiB used)", disk.dir,
                    disk.num_blocks, disk.total_bytes / GIB, config.kv_cache_dir_gib)
    runner.kv_tier_io = KVTierIO(copier, host_rows)
    tiers = KVTiers(config.block_size, block_bytes, host_rows, disk, fingerprint)
    block_manager.tiers = tiers
    return tiers


def _unsupported(config: EngineConfig, block_manager: BlockManager) -> str:
    if not config.enable_prefix_caching:
        return "they extend the prefix cache, and enable_prefix_caching is off"
    if block_manager.num_groups > 1:
        return ("this model has several KV cache groups (sliding-window layers); the tiers cover "
                "models with one")
    spec = config.speculative
    if spec is not None and spec.method == "draft_model":
        return "a draft model's own KV cache is not kept in them"
    return ""


def tier_stats_fields(tiers: KVTiers | None) -> dict[str, int]:
    """EngineStats' host / disk tier fields (engine/types/stats.py)."""
    if tiers is None:
        return {}
    counters = tiers.counters
    fields = {
        "host_cache_blocks": len(tiers.host),
        "host_cache_blocks_total": tiers.host_rows,
        "host_cache_queries": counters.host_queries,
        "host_cache_hits": counters.host_hits,
        "disk_cache_queries": counters.disk_queries,
        "disk_cache_hits": counters.disk_hits,
    }
    if tiers.disk is not None:
        fields["disk_cache_blocks"] = tiers.disk.num_blocks
        fields["disk_cache_blocks_total"] = tiers.disk.max_bytes // max(1, tiers.disk.file_bytes)
    return fields
