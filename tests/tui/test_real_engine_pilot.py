"""The TUI with the real engine (background process) on a tiny random Llama, on CPU."""

from __future__ import annotations

import os

import pytest
from textual.widgets import DataTable, Input

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.block_cells import CACHED
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.engine_factory import real_client_factory
from kvdeck.tui.screens.load_generator import LoadGeneratorScreen
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.chat_message import ChatMessage
from kvdeck.tui.widgets.request_inspector import RequestInspector
from tests.tui.conftest import wait_for

pytestmark = [pytest.mark.slow(seconds=35), pytest.mark.timeout(240)]

ENGINE = dict(device="cpu", num_gpu_blocks_override=128, max_model_len=512,
              attention_backend="torch")
START_TIMEOUT = 120.0  # a cold engine process imports torch: slow on a busy CI machine


def make_real_app(model_dir, tmp_path, max_tokens: int, **engine: object) -> KvdeckApp:
    settings = ChatSettings(temperature=0.0, max_tokens=max_tokens)
    return KvdeckApp(real_client_factory(str(model_dir), {**ENGINE, **engine}),
                     model_name="tiny-llama", transcript_dir=tmp_path / "chats",
                     chat_settings=settings)


async def test_chat_streams_owns_blocks_and_escape_frees_them(tiny_llama_dir, tmp_path,
                                                              kvdeck_home):
    # The Triton kernels under the interpreter (TRITON_INTERPRET=1 reaches the engine
    # process) make each step slow enough to press esc mid-reply; with the torch kernels
    # the tiny model finishes 400 tokens in well under a second.
    app = make_real_app(tiny_llama_dir, tmp_path, max_tokens=400, attention_backend="triton")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready, timeout=START_TIMEOUT), (
            f"engine did not start: {app.client.health() if app.client else None}")
        chat = app.screen.chat
        chat.query_one("#prompt", ChatInput).focus()
        await pilot.press(*"hello there")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: chat.active_request_id is not None)
        request_id = chat.active_request_id
        block_map = app.screen.query_one(BlockMap)
        # The reply streams in and the map shows blocks owned by it.
        reply = list(app.screen.query(ChatMessage).filter(".-assistant"))[0]
        assert await wait_for(pilot, lambda: len(reply.markdown.source) > 0, timeout=30)
        assert await wait_for(pilot, lambda: block_map.cells is not None
                              and request_id in block_map.cells.owners, timeout=10)

        def map_matches_engine() -> bool:  # the map redraws on a timer: allow one tick
            tables = {r.request_id: r.block_table for r in app.dashboard_state.stats.requests}
            blocks = tables.get(request_id, [])
            return bool(blocks) and all(block_map.cells.owners[b] == request_id
                                        for b in blocks)
        assert await wait_for(pilot, map_matches_engine, timeout=5)
        # Esc mid-reply: it stops, keeps the partial text, and the blocks are freed.
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: not chat.generating, timeout=10)
        assert chat.transcript.turns[-1].role == "assistant"
        assert chat.transcript.turns[-1].content == reply.content
        assert "stopped" in chat.transcript.turns[-1].stats
        assert await wait_for(pilot, lambda: app.dashboard_state.stats.num_running == 0
                              and request_id not in block_map.cells.owners, timeout=10)
        assert app.dashboard_state.stats.kv_cache_usage == 0.0
        engine_pid = app.client.pid
        assert engine_pid is not None and engine_pid != os.getpid()
    assert app.client.health().status == "stopped"  # quitting stopped the engine process
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)  # no orphan left behind
    # The engine process logged its start-up, model, pool and shutdown.
    log = (kvdeck_home / "logs" / "engine.log").read_text()
    for line in (f"engine process {engine_pid} starting", "loading: loading weights",
                 "KV pool 128 blocks x 16 tokens", "CUDA graphs off", "shut down on request"):
        assert line in log, log


async def test_load_burst_rises_and_falls_and_inspector_matches_engine(tiny_llama_dir, tmp_path):
    # Interpreted Triton kernels again: with the torch kernels the whole burst can finish
    # between two stats snapshots.
    app = make_real_app(tiny_llama_dir, tmp_path, max_tokens=16, attention_backend="triton")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready, timeout=START_TIMEOUT)
        await pilot.press("ctrl+l")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LoadGeneratorScreen))
        for name, value in dict(num_requests=6, prompt_tokens=64, output_tokens=48,
                                shared_prefix_tokens=32).items():
            app.screen.query_one(f"#{name}", Input).value = str(value)
        app.screen.action_fire()
        state = app.dashboard_state
        assert await wait_for(pilot, lambda: state.stats is not None
                              and state.stats.num_running >= 2, timeout=30)
        assert state.stats.kv_cache_usage > 0
        # The leader went first, so the first burst already shares its two prefix blocks.
        assert await wait_for(pilot, lambda: max(state.stats.block_ref_counts) > 1, timeout=30)
        # Select a running request: the inspector shows the engine's block table for it.
        inspector = app.screen.query_one(RequestInspector)
        table = inspector.query_one(DataTable)
        table.focus()
        assert await wait_for(pilot, lambda: table.row_count >= 1, timeout=15)
        # "down" moves the cursor only when there is a row below it: select the top row.
        inspector.select(next(iter(inspector._rows)))
        assert await wait_for(pilot, lambda: inspector.selected_id is not None, timeout=15)
        selected = inspector.selected_id
        # The map follows the selection (a message away).
        assert await wait_for(pilot, lambda: app.screen.query_one(BlockMap).selected_request
                              == selected, timeout=15)
        await pilot.pause(0.2)
        drawn = inspector._requests.get(selected)  # what the table last drew, if still running
        if drawn is not None and drawn.block_table:
            detail = str(inspector.query_one("#request-detail").render())
            assert "  ".join(f"{i}→{b}" for i, b in enumerate(drawn.block_table)) in detail
        # Everything finishes: running and KV usage fall back to zero.
        assert await wait_for(pilot, lambda: not app.load.running, timeout=120)
        assert await wait_for(pilot, lambda: state.stats.num_running == 0
                              and state.stats.kv_cache_usage == 0.0, timeout=30)
        assert state.stats.num_requests_finished >= 6
        # Their full blocks stay in the prefix cache, drawn as cached-evictable in the map.
        assert state.stats.num_cached_blocks > 0
        block_map = app.screen.query_one(BlockMap)
        assert await wait_for(pilot, lambda: CACHED in block_map.cells.kinds, timeout=15), (
            f"cached flags: {sum(state.stats.block_is_cached)}, refs: "
            f"{sum(state.stats.block_ref_counts)}")
        assert len(state.ttft_points) == 6 and state.itl_points


async def test_schema_held_reply_parses_and_the_inspector_says_constrained(tiny_llama_dir,
                                                                           tmp_path):
    """Structured output in the chat, with the real engine: a random tiny model's reply,
    held to a schema from a file, parses and validates; the inspector names the grammar and
    its compile time."""
    import json

    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "score": {"type": "integer", "minimum": 0,
                                                         "maximum": 9}},
              "required": ["answer", "score"], "additionalProperties": False}
    schema_file = tmp_path / "verdict.json"
    schema_file.write_text(json.dumps(schema))
    settings = ChatSettings(temperature=1.0, max_tokens=64, seed=5, response_format="schema",
                            schema_file=str(schema_file))
    # Interpreted Triton kernels: steps slow enough that the stats catch the running request.
    app = KvdeckApp(real_client_factory(str(tiny_llama_dir),
                                        {**ENGINE, "attention_backend": "triton"}),
                    model_name="tiny-llama", transcript_dir=tmp_path / "chats",
                    chat_settings=settings)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready, timeout=START_TIMEOUT)
        chat = app.screen.chat
        chat.query_one("#prompt", ChatInput).focus()
        await pilot.press(*"verdict?")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2
                              and not chat.generating, timeout=150)
        reply = json.loads(chat.transcript.turns[1].content)
        assert reply["answer"] in ("yes", "no") and 0 <= reply["score"] <= 9
        assert set(reply) == {"answer", "score"}
        inspector = app.screen.query_one(RequestInspector)

        def compiled():  # the request as last drawn once its grammar was ready
            seen = {**inspector._finished, **inspector._requests}.values()
            return next((r for r in seen if r.grammar_compile_s is not None), None)

        assert await wait_for(pilot, lambda: compiled() is not None, timeout=30)
        request = compiled()
        assert request.constrained
        inspector.select(request.request_id)
        await pilot.pause(0.2)
        detail = str(inspector.query_one("#request-detail").render())
        assert "constrained, grammar compiled in" in detail
