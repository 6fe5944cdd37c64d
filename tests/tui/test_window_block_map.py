"""The dashboard on a sliding-window model: a long generation's blocks go back to free on
the block map as they slide out of the window, and the summary says what a block is, how
many tokens the pool holds and how many blocks the window released."""

from __future__ import annotations

from kvdeck import LLM, SamplingParams
from kvdeck.tui.block_cells import CACHED, FREE, OWNED, WRITING, classify_blocks
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.widgets.engine_summary import kv_format_line
from tests.model_factory import build_tiny_model

WINDOW = 20


def test_block_map_releases_a_long_generations_window_blocks(tmp_path):
    model_dir = build_tiny_model(tmp_path, "gemma2", sliding_window=WINDOW)
    llm = LLM(str(model_dir), num_gpu_blocks_override=40, max_model_len=400,
              max_num_batched_tokens=16, kv_cache_dtype="int8")
    engine = llm.engine
    engine.add_request("long", [3, 4, 5], SamplingParams(temperature=0.0, max_tokens=200,
                                                         ignore_eos=True))
    ever_owned: set[int] = set()
    released_while_running: set[int] = set()
    state = DashboardState()
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        if not stats.requests:
            continue
        state.add_stats(stats)
        cells = classify_blocks(stats)
        mine = {b for b, owner in enumerate(cells.owners) if owner == "long"}
        # Every block the request holds, in both KV groups, is drawn as its own.
        assert all(cells.kinds[b] in (OWNED, WRITING) for b in mine)
        # Released: free, or cached (evictable) since prefix caching keeps full blocks.
        released_while_running |= {b for b in ever_owned - mine
                                   if cells.kinds[b] in (FREE, CACHED)}
        ever_owned |= mine
    # The local layers' group gave blocks back while the request ran (the global one holds
    # all 13 of its blocks to the end).
    assert len(released_while_running) >= 8
    line = kv_format_line(state).plain
    assert line.startswith("KV int8 · ") and "/block of 16 tok" in line
    assert f"pool holds {stats.kv_cache_tokens:,} tok" in line
    assert f"{stats.num_window_released_blocks:,} blocks slid out of the window" in line
    assert stats.num_window_released_blocks >= 8


def test_format_line_is_empty_without_the_engine_saying():
    state = DashboardState()
    assert kv_format_line(state).plain == ""


def test_tui_pool_holds_four_full_requests_of_a_hybrid_model_at_its_kv_dtype(tmp_path):
    from kvdeck.engine.types.kv_groups import kv_cache_groups, peak_blocks
    from kvdeck.engine.types.model_config import read_model_config
    from kvdeck.tui.engine_factory import POOL_FULL_REQUESTS, tui_pool_gib

    model_dir = build_tiny_model(tmp_path, "gemma2", sliding_window=WINDOW)
    for kv_dtype in ("auto", "int8", "fp8"):
        kwargs = {"kv_cache_dtype": kv_dtype, "max_model_len": 256, "max_num_batched_tokens": 32}
        llm = LLM(str(model_dir), kv_cache_memory_gib=tui_pool_gib(model_dir, kwargs), **kwargs)
        groups = kv_cache_groups(read_model_config(model_dir).layer_windows)
        # The global layers need all 16 blocks of 256 tokens, the local ones a window's.
        assert llm.stats().num_blocks == POOL_FULL_REQUESTS * peak_blocks(groups, 256, 16, 32)
