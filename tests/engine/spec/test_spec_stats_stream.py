"""The speculative part of a stats snapshot survives the stats stream (JSON and back), so an
attached dashboard reads the same acceptance figures as a local one."""

import dataclasses
import json

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.spec_stats import RequestSpecStats, SpecDecodeStats
from kvdeck.engine.types.stats import stats_from_dict, stats_to_dict


def test_spec_stats_round_trip_through_json(tiny_model_dirs, tiny_draft_dirs):
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3}
    with LLM(str(tiny_model_dirs["llama"]), kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        llm.engine.add_request(None, "The quick brown fox", SamplingParams(max_tokens=32, ignore_eos=True))
        for _ in range(4):
            llm.engine.step()
        stats = llm.stats()
    assert stats.spec.num_drafts > 0 and stats.requests[0].spec.num_drafts > 0
    back = stats_from_dict(json.loads(json.dumps(stats_to_dict(stats))))
    assert isinstance(back.spec, SpecDecodeStats) and isinstance(back.requests[0].spec, RequestSpecStats)
    assert back == stats
    # The shallow conversion misses nothing; only the per-block lists are packed.
    packed, full = stats_to_dict(stats), dataclasses.asdict(stats)
    assert packed.pop("block_is_cached") == "".join("01"[f] for f in full.pop("block_is_cached"))
    assert isinstance(packed.pop("block_ref_counts"), str) and full.pop("block_ref_counts")
    assert packed == full
    assert stats_from_dict(dataclasses.asdict(stats)) == stats  # plain lists still read
    assert back.requests[0].spec.acceptance_rate == stats.requests[0].spec.acceptance_rate
