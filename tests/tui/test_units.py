"""Unit tests of the TUI's pure parts: block classification, history, meters, files, specs."""

from __future__ import annotations

import json
import time

import pytest

from kvdeck.engine.types.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvdeck.engine.types.spec_stats import RequestSpecStats, SpecDecodeStats
from kvdeck.engine.types.stats import RequestStats
from kvdeck.tui.block_cells import (
    CACHED,
    FREE,
    OWNED,
    ROLLED_BACK,
    SHARED,
    SPECULATIVE,
    WRITING,
    classify_blocks,
)
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.load_generator import LoadSpec, synthetic_prompts
from kvdeck.tui.reply_meter import ReplyMeter
from kvdeck.tui.transcripts import ChatTurn, Transcript, TranscriptStore
from kvdeck.tui.widgets.block_map import legend_text
from kvdeck.tui.widgets.engine_summary import history_text, kv_gauge
from kvdeck.tui.widgets.request_inspector import block_table_text
from tests.tui.demo_stats import NUM_BLOCKS, demo_stats


def test_classify_blocks_marks_each_state():
    cells = classify_blocks(demo_stats())
    assert cells.num_blocks == NUM_BLOCKS
    assert [cells.kinds[b] for b in range(4)] == [SHARED] * 4  # the shared system prompt
    assert cells.owners[0] == "chat-1a2b"  # first request in stats order owns shared blocks
    assert cells.kinds[4] == OWNED and cells.owners[4] == "chat-1a2b"
    assert cells.kinds[7] == WRITING and cells.kinds[17] == WRITING
    assert cells.kinds[60] == CACHED and cells.kinds[229] == CACHED  # ref 0, hashed
    assert cells.kinds[300] == FREE and cells.owners[300] is None
    assert cells.ref_counts[0] == 4


def test_block_map_lines_cover_thousands_of_blocks_quickly():
    from kvdeck.tui.widgets.block_map import GLYPHS

    stats = demo_stats()
    big = 50_000
    stats.num_blocks = big
    stats.block_ref_counts = stats.block_ref_counts + [0] * (big - NUM_BLOCKS)
    stats.block_is_cached = stats.block_is_cached + [True] * (big - NUM_BLOCKS)
    start = time.perf_counter()
    cells = classify_blocks(stats)
    elapsed = time.perf_counter() - start
    assert cells.kinds[big - 1] == CACHED
    assert elapsed < 0.5, f"classifying {big} blocks took {elapsed:.3f} s"
    assert GLYPHS[CACHED] != GLYPHS[FREE] != GLYPHS[OWNED] != GLYPHS[SHARED] != GLYPHS[WRITING]


def test_dashboard_state_throughput_and_restart():
    state = DashboardState()
    stats = demo_stats()
    for i in range(15):
        stats.timestamp = 100.0 + i * 0.1
        stats.generation_tokens_total = 50 * i
        state.add_stats(stats)
    assert state.tokens_per_s == pytest.approx(500.0)
    assert state.kv_history[-1][0] == pytest.approx(1.4)
    assert state.prefix_hit_rate == pytest.approx(640 / 2000)
    stats.timestamp, stats.generation_tokens_total = 200.0, 3  # a new engine: counters reset
    state.add_stats(stats)
    assert state.tokens_per_s == 0.0
    state.reset()
    assert state.stats is None and not state.kv_history and state.prefix_hit_rate is None


def _output(tokens: int, arrival: float, first: float | None, last: float | None,
            reason: str | None = None) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=arrival, first_token_time=first, last_token_time=last)
    completion = CompletionOutput(0, "x" * tokens, list(range(tokens)), reason)
    return RequestOutput("r", None, [1, 2], [completion], reason is not None, metrics)


def test_reply_meter_uses_engine_timestamps():
    state = DashboardState()
    meter = ReplyMeter(state)
    meter.observe(_output(1, 10.0, 10.25, 10.25))
    meter.observe(_output(3, 10.0, 10.25, 10.45))
    meter.observe(_output(5, 10.0, 10.25, 10.65, "length"))
    result = meter.result()
    assert result.ttft_s == pytest.approx(0.25)
    assert result.num_tokens == 5 and result.finish_reason == "length"
    assert result.tokens_per_s == pytest.approx(4 / 0.4)
    assert [round(ms, 3) for _, ms in state.itl_points] == [100.0, 100.0]
    assert "TTFT 250 ms" in result.describe() and "max tokens" in result.describe()


def test_transcript_store_round_trip_is_atomic_and_lists_newest_first(tmp_path):
    store = TranscriptStore(tmp_path / "chats")
    older = Transcript(id="a1", created="2026-01-01T00:00:00+00:00", system_prompt="sys",
                       turns=[ChatTurn("user", "first question"), ChatTurn("assistant", "ok")])
    newer = Transcript(id="b2", created="2026-02-01T00:00:00+00:00",
                       turns=[ChatTurn("user", "second")])
    store.save(older)
    store.save(newer)
    (tmp_path / "chats" / "broken.json").write_text("{not json")
    assert [t.id for t in store.list()] == ["b2", "a1"]
    loaded = store.load("a1")
    assert loaded == older and loaded.title == "first question"
    assert loaded.messages()[0] == {"role": "system", "content": "sys"}
    assert not list((tmp_path / "chats").glob(".*.tmp"))  # no temp files left behind
    assert json.loads((tmp_path / "chats" / "a1.json").read_text())["format"] == 1
    with pytest.raises(ValueError, match="alphanumeric"):
        store.path_for("../etc")
    with pytest.raises(ValueError, match="role"):
        ChatTurn("robot", "hi")


def test_chat_settings_parse_names_the_bad_field():
    settings = ChatSettings.parse("be brief", "0.2", "0.9", "64", "")
    assert settings.seed is None and settings.sampling_params().max_tokens == 64
    with pytest.raises(ValueError, match="max_tokens"):
        ChatSettings.parse("", "0.2", "0.9", "0", "")
    with pytest.raises(ValueError, match="seed must be an integer"):
        ChatSettings.parse("", "0.2", "0.9", "64", "x")
    with pytest.raises(ValueError, match="temperature"):
        ChatSettings.parse("", "-1", "0.9", "64", "")


def test_load_spec_validation_and_shared_prefix():
    spec = LoadSpec(num_requests=4, prompt_tokens=20, output_tokens=5, shared_prefix_tokens=8)
    spec.validate(max_model_len=64)
    prompts = synthetic_prompts(spec, 100, seed=5)
    assert len(prompts) == 4 and all(len(p) == 20 for p in prompts)
    assert all(p[:8] == prompts[0][:8] for p in prompts)
    assert len({tuple(p[8:]) for p in prompts}) == 4
    assert all(3 <= t < 100 for p in prompts for t in p)
    assert synthetic_prompts(spec, 100, seed=5) == prompts  # seeded: the same burst again
    assert synthetic_prompts(spec, 100, seed=6)[0][:8] != prompts[0][:8]  # another: fresh
    for bad, message in ((dict(num_requests=0), "num_requests"),
                         (dict(shared_prefix_tokens=30), "shared_prefix_tokens"),
                         (dict(prompt_tokens=60), "max_model_len"),
                         (dict(seed=-1), "seed")):
        with pytest.raises(ValueError, match=message):
            LoadSpec(**{**dict(num_requests=4, prompt_tokens=20, output_tokens=5,
                            shared_prefix_tokens=8), **bad}
                     ).validate(max_model_len=64)


def test_gauge_and_history_text():
    assert kv_gauge(0.5, width=10).plain == "KV █████░░░░░  50.0%"
    assert history_text([0.0, 0.01, 1.0], 5).plain == "    ▁█"[-5:]


def test_model_text_is_made_displayable():
    from kvdeck.tui.widgets.chat_message import displayable

    assert displayable("a\r\nb\x11c\td\x7f") == "a\nb\ufffdc\td\ufffd"


def test_widgets_get_their_services_not_the_app():
    """Services are passed in: no widget reaches into the App for its services."""
    from pathlib import Path

    import kvdeck.tui

    root = Path(kvdeck.tui.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "type: ignore[attr-defined]" in p.read_text()]
    assert offenders == []


def test_request_colours_keep_neighbours_apart_and_stay_put():
    from kvdeck.tui.request_colours import RequestColours, palette_colour

    def rgb(colour: str) -> tuple[int, int, int]:
        return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))

    def distance(a: str, b: str) -> float:
        return sum((x - y) ** 2 for x, y in zip(rgb(a), rgb(b), strict=True)) ** 0.5

    first = [palette_colour(i) for i in range(12)]
    assert len(set(first)) == 12
    assert min(distance(a, b) for a, b in zip(first, first[1:])) > 120  # neighbours differ
    assert min(distance(a, b) for i, a in enumerate(first[:8]) for b in first[i + 1:8]) > 60
    colours = RequestColours()
    colours.observe(["a", "b", "c"])
    assert [colours.index(r) for r in "abc"] == [0, 1, 2]
    assert colours.colour("b") == palette_colour(1)  # the same request keeps its colour


def test_plot_ticks_are_round():
    from kvdeck.tui.plot_ticks import labelled, nice_ticks

    assert labelled(nice_ticks(3352.7)) == ["0", "1000", "2000", "3000", "4000"]
    assert labelled(nice_ticks(100)) == ["0", "25", "50", "75", "100"]
    assert labelled(nice_ticks(0.73)) == ["0.0", "0.2", "0.4", "0.6", "0.8"]
    assert labelled(nice_ticks(1.0)) == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert labelled(nice_ticks(57, 2)) == ["0", "50", "100"]


def test_summary_says_idle_when_nothing_runs():
    from kvdeck.tui.widgets.engine_summary import throughput_line

    state = DashboardState()
    stats = demo_stats()
    state.add_stats(stats)
    assert "step 256 prefill" in throughput_line(state).plain
    stats.num_running = stats.num_waiting = 0
    state.add_stats(stats)
    assert throughput_line(state).plain.endswith("· idle")


def test_the_title_names_the_demo_model_as_the_engine_does():
    from kvdeck.engine.api.async_llm import DEMO_MODEL_NAME
    from kvdeck.tui.engine_session import display_model_name

    assert display_model_name(None) == DEMO_MODEL_NAME  # not "demo model", then renamed


def test_inspector_shows_a_requests_speculative_acceptance():
    request = RequestStats("r1", "decoding", 10, 30, 20, [3, 4], 0)
    assert "speculative" not in block_table_text(request, "red").plain
    request.spec = RequestSpecStats(num_drafts=4, num_draft_tokens=12, num_accepted_tokens=9,
                                    accepted_history=[3, 3, 0, 3])
    text = block_table_text(request, "red").plain
    assert "speculative: 75% of 12 drafts accepted, 2.25 per step over 4 steps" in text
    assert "accepted per step: 3 3 0 3" in text
    assert "logical→physical: 0→3  1→4" in text


def test_block_map_marks_draft_blocks_and_flashes_rolled_back_ones():
    stats = demo_stats()
    # chat-1a2b's last block (7) took drafts at slots 7*16+9..; block 27 held only rejected
    # drafts and was given back (ref 0 now).
    stats.spec = SpecDecodeStats("ngram", 4, 16, slots_written_last_step=[7 * 16 + 9, 7 * 16 + 10],
                                 blocks_rolled_back_last_step=[27])
    cells = classify_blocks(stats)
    assert cells.kinds[7] == SPECULATIVE and cells.kinds[27] == ROLLED_BACK
    assert cells.kinds[17] == WRITING and cells.kinds[300] == FREE  # the rest as before
    assert "rolled back" in legend_text(16, speculative=True).plain
    assert "rolled back" not in legend_text(16).plain


@pytest.mark.parametrize("width", [200, 96, 80, 40, 12])
def test_the_legend_breaks_between_its_entries(width):
    from kvdeck.tui.widgets.block_map import legend_parts
    from kvdeck.tui.widgets.flow_text import flow

    parts = legend_parts(16, speculative=True)
    lines = flow([parts], width).plain.splitlines()
    entries = [part.plain for part in parts]
    # Every entry whole on one line, in order; a line over the width only for one entry.
    assert [entry for line in lines for entry in line.split("  ")] == entries
    assert all(len(line) <= width or line in entries for line in lines)
    if width >= len(legend_text(16, speculative=True).plain):
        assert len(lines) == 1


def test_tui_pool_is_sized_at_the_dtype_the_cpu_engine_runs(tmp_path):
    """dtype auto: an INT4 (AWQ, float16) checkpoint runs bf16 KV on a CPU with bf16 and the INT4
    kernels (app/store/cpu_plan.py), fp32 on one without; a bf16 checkpoint likewise."""
    from kvdeck.app.store.cpu_plan import CpuFeatures
    from kvdeck.tui.engine_factory import tui_pool_gib

    everything = CpuFeatures(bf16=True, bf16_kernels=True, int4_kernels=True)
    no_int4 = CpuFeatures(bf16=True, bf16_kernels=True, int4_kernels=False)
    nothing = CpuFeatures(bf16=False, bf16_kernels=False, int4_kernels=False)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 256}
    pools = {}
    for name, extra in (("awq", {"torch_dtype": "float16", "quantization_config": {
            "quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}}),
                        ("bf16", {"torch_dtype": "bfloat16"})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
        pools[name] = {cpu: tui_pool_gib(folder, {"max_model_len": 256}, cpu=cpu)
                       for cpu in (everything, no_int4, nothing)}
    awq, bf16 = pools["awq"], pools["bf16"]
    assert awq[everything] == pytest.approx(awq[nothing] / 2, rel=0.01)  # bf16 KV, not fp32
    assert awq[no_int4] == awq[nothing]  # no INT4 kernels: fp32
    assert bf16[everything] == bf16[no_int4] == pytest.approx(bf16[nothing] / 2, rel=0.01)
    assert tui_pool_gib(tmp_path / "awq", {"max_model_len": 256, "dtype": "float32"}, cpu=everything) \
        == awq[nothing]
