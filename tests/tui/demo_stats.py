"""Fixed engine snapshots and latencies for snapshot pictures (no clock, no randomness)."""

from __future__ import annotations

from kvdeck.engine.types.stats import EngineStats, RequestStats

NUM_BLOCKS = 1024
BLOCK_SIZE = 16


def demo_requests() -> list[RequestStats]:
    # Four requests share a 4-block system prompt (blocks 0-3); one is being prefilled in
    # chunks, one waits, one was preempted.
    shared = [0, 1, 2, 3]
    return [
        RequestStats("chat-1a2b", "decoding", 70, 70, 41, shared + [4, 5, 6, 7], 64),
        RequestStats("load1-0", "decoding", 128, 128, 30, shared + list(range(8, 18)), 64),
        RequestStats("load1-1", "decoding", 128, 128, 12, shared + list(range(18, 27)), 64),
        RequestStats("load1-2", "prefilling", 512, 256, 0, shared + list(range(40, 52)), 64),
        RequestStats("load1-3", "waiting", 128, 0, 0, [], 0),
        RequestStats("load1-4", "preempted", 128, 0, 0, [], 0),
    ]


def demo_stats(step: int = 0) -> EngineStats:
    requests = demo_requests()
    refs = [0] * NUM_BLOCKS
    for request in requests:
        for block in request.block_table:
            refs[block] += 1
    cached = [False] * NUM_BLOCKS
    for block in (*range(0, 4), *range(60, 90), *range(200, 230)):
        cached[block] = True
    used = sum(1 for r in refs if r)
    free = NUM_BLOCKS - used
    cached_free = sum(1 for r, c in zip(refs, cached, strict=True) if c and not r)
    return EngineStats(
        timestamp=1000.0 + step * 2.5,  # 20 snapshots span most of the graphs' minute
        num_running=4, num_waiting=2, num_preempted=1,
        kv_cache_usage=used / NUM_BLOCKS, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
        num_free_blocks=free, num_cached_blocks=cached_free,
        block_ref_counts=refs, block_is_cached=cached,
        blocks_written_last_step=[7, 17, 26, *range(48, 52)],
        requests=requests,
        prefix_cache_queries=2000, prefix_cache_hits=640, num_preemptions=1,
        prompt_tokens_total=2000, generation_tokens_total=100 + step * 30,
        num_requests_finished=3, num_steps=200 + step,
        last_step_prefill_tokens=256, last_step_decode_tokens=3, last_step_num_seqs=4,
        last_step_duration_s=0.0123,
    )


def demo_stats_series(count: int = 20) -> list[EngineStats]:
    return [demo_stats(step) for step in range(count)]


def demo_latencies() -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(TTFT points, ITL points): (seconds since start, seconds)."""
    ttft = [(4.0 * i, 0.05 + 0.01 * (i % 5)) for i in range(12)]
    itl = [(1.2 * i, 0.02 + 0.002 * (i % 7)) for i in range(40)]
    return ttft, itl
