"""A synthetic engine session for recording tests: deterministic EngineStats snapshots whose
requests arrive, prefill, decode, get preempted and finish, with timelines, speculative
stats and a block map that changes a few blocks each step (no clock, no randomness)."""

from __future__ import annotations

from kvdeck.engine.types.request_timeline import TimelineSnapshot, TTFTParts
from kvdeck.engine.types.spec_stats import RequestSpecStats, SpecDecodeStats
from kvdeck.engine.types.stats import EngineStats, RequestStats

NUM_BLOCKS = 256
BLOCK_SIZE = 16
T0 = 1_700_000_000.0
DT = 0.1  # seconds between snapshots


def _timeline(t: float, arrived: float, step: int, first_step: int) -> TimelineSnapshot:
    phases = [(arrived, "queued")]
    if step >= first_step:
        phases.append((arrived + 0.05, "prefill"))
    if step >= first_step + 2:
        phases.append((arrived + 0.15, "decode"))
    return TimelineSnapshot(
        queued_at=arrived, taken_at=t, phases=phases,
        prefill_chunks=[(first_step, 64, 16)] if step >= first_step else [],
        decode_runs=[(first_step + 2, step, step - first_step - 1)] if step >= first_step + 2 else [],
        ttft=TTFTParts(0.05, 0.0, 0.1) if step >= first_step + 2 else None)


def session_stats(count: int = 60) -> list[EngineStats]:
    """`count` snapshots DT apart; request r arrives at snapshot 5r and lives 20 snapshots."""
    out = []
    for i in range(count):
        t = T0 + i * DT
        requests = []
        refs = [0] * NUM_BLOCKS
        for r in range(count // 5 + 1):
            born = 5 * r
            if not born <= i < born + 20:
                continue
            age = i - born
            state = "waiting" if age < 1 else "prefilling" if age < 3 else \
                "preempted" if 10 <= age < 12 else "decoding"
            table = [] if state in ("waiting", "preempted") else \
                [(r * 7 + k) % NUM_BLOCKS for k in range(2 + age // 4)]
            for block in table:
                refs[block] += 1
            requests.append(RequestStats(
                f"req-{r}", state, 64, min(64, age * 32), max(0, age - 2), table, 16,
                spec=RequestSpecStats(age, age * 3, age * 2, [2] * min(age, 5)) if r % 2 else None,
                reason=f"{state}: step {i}",
                timeline=_timeline(t, T0 + born * DT, i, born + 1)))
        cached = [block % 9 == 0 and not refs[block] for block in range(NUM_BLOCKS)]
        used = sum(1 for n in refs if n)
        out.append(EngineStats(
            timestamp=t, num_running=sum(r.state in ("prefilling", "decoding") for r in requests),
            num_waiting=sum(r.state == "waiting" for r in requests),
            num_preempted=sum(r.state == "preempted" for r in requests),
            kv_cache_usage=used / NUM_BLOCKS, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
            num_free_blocks=NUM_BLOCKS - used, num_cached_blocks=sum(cached),
            block_ref_counts=refs, block_is_cached=cached,
            blocks_written_last_step=[b for r in requests for b in r.block_table[-1:]],
            requests=requests, prefix_cache_queries=64 * i, prefix_cache_hits=16 * i,
            num_preemptions=i // 10, prompt_tokens_total=64 * i, generation_tokens_total=7 * i,
            num_requests_finished=max(0, (i - 20) // 5 + 1), num_steps=3 * i,
            last_step_prefill_tokens=32 * (i % 3), last_step_decode_tokens=len(requests),
            last_step_num_seqs=len(requests), last_step_duration_s=0.01 + 0.001 * (i % 4),
            finished_reasons={"length": max(0, (i - 20) // 5 + 1)},
            spec=SpecDecodeStats("ngram", 4, None, num_drafts=i, num_draft_tokens=3 * i,
                                 num_accepted_tokens=2 * i),
            kv_cache_dtype="bfloat16", kv_bytes_per_block=4096, kv_cache_tokens=NUM_BLOCKS * 16))
    return out


ENGINE_INFO = {"model": "synthetic", "block_size": BLOCK_SIZE, "num_blocks": NUM_BLOCKS,
               "dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "max_num_seqs": 8,
               "max_num_batched_tokens": 2048, "enable_prefix_caching": True,
               "max_model_len": 512, "device": "cpu"}
