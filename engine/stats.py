"""A snapshot of the engine's state for the dashboard and /metrics."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestStats:
    request_id: str
    state: str  # "waiting" | "prefilling" | "decoding" | "preempted"
    num_prompt_tokens: int
    num_computed_tokens: int
    num_output_tokens: int
    block_table: list[int]  # logical block i -> physical block id
    num_cached_tokens: int  # prompt tokens served from the prefix cache


@dataclass(slots=True)
class EngineStats:
    timestamp: float
    num_running: int
    num_waiting: int
    num_preempted: int  # waiting requests that were preempted and will be recomputed
    kv_cache_usage: float  # fraction of blocks in use (cached-but-free blocks count as free)
    num_blocks: int
    block_size: int
    num_free_blocks: int  # includes cached blocks that can be evicted
    num_cached_blocks: int  # free blocks still holding a reusable prefix
    # Per physical block: reference count and whether it holds a hashed (full, cacheable) prefix.
    block_ref_counts: list[int]
    block_is_cached: list[bool]
    # Blocks written by the last step (new K/V landed in them).
    blocks_written_last_step: list[int]
    requests: list[RequestStats]
    # Counters since start.
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # prompt tokens found in the cache
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished: int
    num_steps: int
    # The last step's batch.
    last_step_prefill_tokens: int
    last_step_decode_tokens: int
    last_step_num_seqs: int
    last_step_duration_s: float
    finished_reasons: dict[str, int] = field(default_factory=dict)
