"""The engine's stats snapshot (EngineStats): the pool block by block, each running and
waiting request with its block tables and its reason line, the last step, the counters,
speculation's and the KV tiers' figures. Built on demand: the loop sends one at most every
stats interval, not every step."""

import time
from typing import TYPE_CHECKING

from kvdeck.engine.core.kv_tiers_setup import tier_stats_fields
from kvdeck.engine.core.request import Request, RequestStatus
from kvdeck.engine.core.request_reason import describe_requests
from kvdeck.engine.core.swap import swap_stats_fields
from kvdeck.engine.runner.lora.manager import lora_slot_stats
from kvdeck.engine.types.stats import EngineStats, RequestStats

if TYPE_CHECKING:
    from kvdeck.engine.core.engine_core import EngineCore


def engine_stats(core: "EngineCore") -> EngineStats:
    """Everything the dashboard, /metrics and a recording read, at this moment."""
    bm = core.block_manager
    sched = core.scheduler
    described = [*sched.running, *sched.waiting]
    requests = [request_stats(r) for r in described]
    if core.spec is not None:
        for entry in requests:
            entry.spec = core.spec.request_stats(entry.request_id)
    describe_requests(requests, described, sched)
    last = core.last_step
    return EngineStats(
        timestamp=time.time(),
        num_running=len(sched.running),
        num_waiting=len(sched.waiting),
        num_preempted=sum(1 for r in sched.waiting if r.status is RequestStatus.PREEMPTED),
        kv_cache_usage=bm.usage,
        num_blocks=bm.num_blocks,
        block_size=bm.block_size,
        num_free_blocks=bm.num_free_blocks,
        num_cached_blocks=bm.num_cached_free_blocks,
        block_ref_counts=[b.ref_count for b in bm.blocks],
        block_is_cached=[b.hash is not None for b in bm.blocks],
        block_group=[b.group for b in bm.blocks] if bm.num_groups > 1 else [],
        num_window_released_blocks=bm.num_window_released,
        kv_cache_dtype=core.runner.kv_pool.format.name,
        kv_bytes_per_block=core.kv_plan.bytes_per_block,
        kv_cache_tokens=core.kv_plan.num_tokens,
        blocks_written_last_step=core.blocks_written_last_step,
        requests=requests,
        prefix_cache_queries=bm.prefix_cache_queries,
        prefix_cache_hits=bm.prefix_cache_hits,
        num_preemptions=sched.num_preemptions,
        prompt_tokens_total=core.prompt_tokens_total,
        generation_tokens_total=core.generation_tokens_total,
        num_requests_finished=sum(core.finish_counts.values()),
        num_steps=core.num_steps,
        last_step_prefill_tokens=last.prefill_tokens,
        last_step_decode_tokens=last.decode_tokens,
        last_step_num_seqs=last.num_seqs,
        last_step_duration_s=last.duration_s,
        finished_reasons=dict(core.finish_counts),
        spec=core.spec.stats() if core.spec is not None else None,
        kernel_compiles_total=core.runner.kernel_compiles(),
        lora=lora_slot_stats(core.runner.lora),
        **tier_stats_fields(core.kv_tiers),
        **swap_stats_fields(sched.swap),
    )


def request_stats(request: Request) -> RequestStats:
    if request.status is RequestStatus.RUNNING:
        state = "prefilling" if request.is_prefilling else "decoding"
    else:
        state = request.status.value
    return RequestStats(
        request_id=request.request_id,
        state=state,
        num_prompt_tokens=request.num_prompt_tokens,
        num_computed_tokens=request.num_computed_tokens,
        num_output_tokens=request.num_output_tokens,
        block_table=list(request.block_table),
        block_tables=[list(t) for t in request.block_tables] if len(request.block_tables) > 1 else [],
        num_cached_tokens=request.num_cached_tokens,
        num_host_cached_tokens=request.num_cached_tokens_host,
        num_disk_cached_tokens=request.num_cached_tokens_disk,
        constrained=request.grammar is not None,
        lora_name=request.lora_request.lora_name if request.lora_request is not None else None,
        grammar_compile_s=request.grammar.compile_s if request.grammar is not None else None,
    )
