"""`kvdeck attach` end to end (Pilot): the TUI on a live `kvdeck --serve`, on vLLM-style
replicas, on a server that goes away, one that stalls, and one that refuses the key."""

import asyncio
import math
import threading
import time

import httpx
import pytest
from textual.widgets import DataTable, Input, Static

from kvdeck.app.attach import remote_client
from kvdeck.app.attach.prometheus import parse
from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.attached_servers import AttachedServers
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.load_generator import LoadSpec
from kvdeck.tui.screens.engine_error import EngineErrorScreen
from kvdeck.tui.screens.load_generator import LoadGeneratorScreen
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.server_table import SUM_KEY, ServerTable
from tests.attach import fake_vllm
from tests.serve.conftest import free_port, start_server, stop_server
from tests.tui.conftest import wait_for

API_KEY = "pilot-secret"
TTFT_SAMPLES = ([0.003, 0.004, 0.012, 0.015, 0.03, 0.05, 0.07, 0.09, 0.2, 0.3],
                [0.008, 0.009, 0.018, 0.019, 0.045, 0.55, 0.6, 1.5])


@pytest.fixture(autouse=True)
def kvdeck_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path / "kvdeck-home"))


def attached_app(urls: list[str], tmp_path, api_key: str | None = None,
                 max_tokens: int = 12) -> KvdeckApp:
    servers = AttachedServers(urls, api_key)
    return KvdeckApp(servers.client_factory(), urls[0], transcript_dir=tmp_path / "chats",
                     chat_settings=ChatSettings(temperature=0.0, max_tokens=max_tokens),
                     servers=servers)


def histogram_quantile(samples: list[float], bounds: list[float], q: float) -> float:
    """Prometheus' histogram_quantile, computed here from the raw samples."""
    cumulative = [sum(1 for s in samples if s <= bound) for bound in bounds]
    rank = q * len(samples)
    lower, below = 0.0, 0
    for bound, count in zip(bounds, cumulative):
        if count >= rank:
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


async def send_chat(pilot, app: KvdeckApp, text: str) -> None:
    chat = app.screen.chat
    chat.query_one("#prompt", ChatInput).focus()
    await pilot.press(*text)
    await pilot.press("enter")


def cell(table: DataTable, row: str, column: str) -> str:
    return str(table.get_cell(row, column))


async def test_vllm_replicas_percentiles_sum_disconnect_and_chat(tmp_path, monkeypatch):
    monkeypatch.setattr(remote_client, "METRICS_INTERVAL_S", 0.2)
    metrics = [fake_vllm.VllmMetrics(), fake_vllm.VllmMetrics()]
    ports = [free_port(), free_port()]
    behaviour = fake_vllm.Behaviour()
    running = [fake_vllm.serve(fake_vllm.create_app(m, behaviour if i == 0 else None), port)
               for i, (m, port) in enumerate(zip(metrics, ports))]
    app = attached_app([r.url for r in running], tmp_path)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            assert await wait_for(pilot, lambda: app.engine_ready, timeout=20)
            dashboard = app.screen.query_one(Dashboard)
            # No block map from vLLM: the dashboard says so instead of drawing an empty one.
            assert await wait_for(pilot, lambda: dashboard.has_class("-no-block-map"))
            notice = str(dashboard.query_one("#no-block-map", Static).render())
            assert "vLLM at" in notice and "need a kvdeck engine" in notice
            assert not dashboard.query_one(BlockMap).display or not dashboard.query_one(
                BlockMap).region.area
            monitors = app.servers.monitors
            assert await wait_for(pilot, lambda: all(m.last_metrics for m in monitors), timeout=20)
            # Traffic after the first scrape: each replica observes known TTFTs.
            for replica, samples in zip(metrics, TTFT_SAMPLES):
                replica.kv.labels(model_name=fake_vllm.MODEL, engine="0").set(0.5)
                replica.running.labels(model_name=fake_vllm.MODEL, engine="0").set(3)
                for sample in samples:
                    replica.ttft.labels(model_name=fake_vllm.MODEL, engine="0").observe(sample)
            total = sum(len(s) for s in TTFT_SAMPLES)
            assert await wait_for(pilot, lambda: all(
                m.last_metrics.histograms.get("ttft") and m.last_metrics.histograms["ttft"].count
                == len(s) for m, s in zip(monitors, TTFT_SAMPLES)), timeout=20)
            app.screen.dashboard.show_tab("tab-servers")
            table = app.screen.query_one(ServerTable).query_one(DataTable)
            bounds = fake_vllm.TTFT_BUCKETS
            for replica_url, samples in zip(app.servers.urls, TTFT_SAMPLES):
                for q, column in ((0.5, "TTFT p50"), (0.99, "TTFT p99")):
                    expected = f"{histogram_quantile(samples, bounds, q) * 1000:.0f} ms"
                    assert await wait_for(pilot, lambda u=replica_url, c=column, e=expected:
                                          cell(table, u, c) == e), (
                        cell(table, replica_url, column), expected)
            # The summed row: the two histograms merged, the loads added, usage averaged.
            merged = [s for samples in TTFT_SAMPLES for s in samples]
            assert len(merged) == total
            for q, column in ((0.5, "TTFT p50"), (0.99, "TTFT p99")):
                expected = f"{histogram_quantile(merged, bounds, q) * 1000:.0f} ms"
                assert await wait_for(pilot, lambda c=column, e=expected: cell(table, SUM_KEY, c) == e)
            assert cell(table, SUM_KEY, "running") == "6" and cell(table, SUM_KEY, "KV") == "50.0%"
            # The dashboard's headline reads the selected replica's metrics.
            assert await wait_for(pilot, lambda: app.dashboard_state.metrics.kv_cache_usage
                                  == pytest.approx(0.5), timeout=10)

            # Chat through the first replica's OpenAI API.
            await send_chat(pilot, app, "hi")
            assert await wait_for(pilot, lambda: app.screen.chat.last_reply is not None
                                  and not app.screen.chat.generating, timeout=20), [
                n.message for n in app._notifications]
            assert app.screen.chat.transcript.turns[-1].content == "".join(fake_vllm.REPLY)

            # The load generator, on a server that does not say its vocabulary size: prompts
            # drawn from ids its /tokenize produced.
            assert app.client.token_pool
            app._fire_load(LoadSpec(num_requests=4, prompt_tokens=16, output_tokens=4,
                                    shared_prefix_tokens=8, seed=3))
            assert await wait_for(pilot, lambda: behaviour.completions == 4, timeout=20)
            assert await wait_for(pilot, lambda: not app.load.running, timeout=20)

            # Replica 2 goes away: greyed with its last figures, the sum says so, UI ticks on.
            await asyncio.to_thread(running[1].stop)
            second = app.servers.urls[1]
            assert await wait_for(pilot, lambda: cell(table, second, "state") == "disconnected",
                                  timeout=20)
            assert cell(table, second, "KV") == "50.0%"  # the last figures stay
            assert table.get_cell(second, "KV").style == "#7a7a7a"
            assert "(1 connected)" in cell(table, SUM_KEY, "server")
            # It comes back on the same port: reconnected by itself.
            running[1] = await asyncio.to_thread(fake_vllm.serve,
                                                 fake_vllm.create_app(metrics[1]), ports[1])
            assert await wait_for(pilot, lambda: cell(table, second, "state") == "connected",
                                  timeout=30)

            # The chat's own server goes away: the dashboard greys, no error screen.
            await asyncio.to_thread(running[0].stop)
            assert await wait_for(pilot, lambda: dashboard.has_class("-disconnected"), timeout=20)
            assert not isinstance(app.screen, EngineErrorScreen)
            assert not app.engine_ready  # the chat waits instead of failing each message
            running[0] = await asyncio.to_thread(fake_vllm.serve,
                                                 fake_vllm.create_app(metrics[0]), ports[0])
            assert await wait_for(pilot, lambda: not dashboard.has_class("-disconnected"),
                                  timeout=30)
            assert app.engine_ready

            # f6: the chat and headline move to the second replica.
            await pilot.press("f6")
            assert await wait_for(pilot, lambda: app.engine_ready
                                  and app.client.url == second, timeout=20)
            assert cell(table, second, "server").startswith("▶")
    finally:
        for server in running:
            await asyncio.to_thread(server.stop)


async def test_a_stalled_server_does_not_freeze_the_ui(tmp_path, monkeypatch):
    monkeypatch.setattr(remote_client, "METRICS_INTERVAL_S", 0.2)
    monkeypatch.setattr(remote_client, "REQUEST_TIMEOUT_S", 1.0)
    behaviour = fake_vllm.Behaviour()
    running = fake_vllm.serve(fake_vllm.create_app(fake_vllm.VllmMetrics(), behaviour))
    app = attached_app([running.url], tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            assert await wait_for(pilot, lambda: app.engine_ready, timeout=20)
            dashboard = app.screen.query_one(Dashboard)
            behaviour.stall_s = 30.0  # every answer now takes 30 s
            ticks, start = dashboard.ticks, time.monotonic()
            await pilot.pause(3.0)
            rate = (dashboard.ticks - ticks) / (time.monotonic() - start)
            assert rate >= 5, f"the dashboard redrew {rate:.1f} times a second while stalled"
            assert await wait_for(pilot, lambda: dashboard.has_class("-disconnected"), timeout=10)
            behaviour.stall_s = 0.0
            assert await wait_for(pilot, lambda: not dashboard.has_class("-disconnected"),
                                  timeout=30)
    finally:
        await asyncio.to_thread(running.stop)


async def test_a_wrong_key_is_a_clear_message(tmp_path):
    behaviour = fake_vllm.Behaviour(api_key="right")
    running = fake_vllm.serve(fake_vllm.create_app(fake_vllm.VllmMetrics(), behaviour))
    app = attached_app([running.url], tmp_path, api_key="wrong")
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            def shown() -> str:  # the error screen's text, once it is composed
                screen = app.screen
                if not isinstance(screen, EngineErrorScreen):
                    return ""
                return " ".join(str(w.render()) for w in screen.query(Static))

            # The screen's title can render a frame before its detail: wait for the whole text.
            assert await wait_for(pilot, lambda: "refused the API key" in shown(), timeout=30), shown()
            text = shown()
            assert "Could not attach" in text and "--api-key" in text
    finally:
        await asyncio.to_thread(running.stop)


async def test_a_health_check_while_the_app_closes_is_a_no_op(tmp_path):
    """The health timer can fire after the screens are gone (seen once in CI): nothing to check."""
    app = attached_app(["http://127.0.0.1:9"], tmp_path)
    app.engine.client = client = app.client_factory()
    try:
        assert not app.screen_stack
        app.check_engine_health()
        app.show_engine_error("The engine stopped", "while closing")
    finally:
        await client.shutdown()


@pytest.fixture(scope="module")
def kvdeck_server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("pilot_logs"), api_key=API_KEY)
    yield live
    stop_server(live)


def server_kv_usage(server) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=server.headers, timeout=10).text
    return parse(text, time.time()).value("vllm:kv_cache_usage_perc")


async def test_attached_to_kvdeck_chat_burst_owners_and_freed_blocks(kvdeck_server, tmp_path):
    app = attached_app([kvdeck_server.base_url], tmp_path, api_key=API_KEY)
    async with app.run_test(size=(200, 50)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready, timeout=30)
        state = app.dashboard_state
        assert state.source == "kvdeck" and "kvdeck at" in app.title
        assert await wait_for(pilot, lambda: state.stats is not None, timeout=20)
        block_map = app.screen.query_one(BlockMap)
        assert block_map.display and not app.screen.dashboard.has_class("-no-block-map")

        await send_chat(pilot, app, "hello")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: chat.last_reply is not None and not chat.generating,
                              timeout=120)
        assert chat.transcript.turns[-1].role == "assistant"
        assert chat.transcript.turns[-1].content  # the server's tokens, streamed
        # The server's own latency feed reached the graphs (TTFT of the chat's request).
        assert await wait_for(pilot, lambda: len(state.ttft_points) >= 1, timeout=10)

        # A burst from the attached TUI: owners on the map, then every block freed.
        await pilot.press("ctrl+l")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LoadGeneratorScreen))
        for name, value in dict(num_requests=6, prompt_tokens=48, output_tokens=200,
                                shared_prefix_tokens=16).items():
            app.screen.query_one(f"#{name}", Input).value = str(value)
        # The server's /metrics gauge, read throughout the burst from another thread: a
        # fast engine (the native decoder stack) can finish the burst before a reader that
        # starts once the map shows it gets its first answer.
        scrapes: list[float] = []
        stop_scraping = threading.Event()

        def scrape() -> None:
            while not stop_scraping.is_set():
                scrapes.append(server_kv_usage(kvdeck_server))
                time.sleep(0.02)

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            app.screen.action_fire()
            assert await wait_for(pilot, lambda: state.stats is not None and any(
                r.block_table for r in state.stats.requests), timeout=60)
            busy = state.stats
            owned = {b for r in busy.requests for b in r.block_table}
            assert owned and all(busy.block_ref_counts[b] >= 1 for b in owned)
            assert await wait_for(pilot, lambda: not app.load.running, timeout=180)
        finally:
            stop_scraping.set()
            await asyncio.to_thread(scraper.join, 10)
        await pilot.pause(0.5)
        # Mid-burst, the server's /metrics gauge was one of the snapshots the map drew (give
        # or take a block: a slow reader may be sent only the newest snapshot, so allow the
        # largest step between two drawn snapshots).
        drawn = [usage for _, usage in state.kv_history]
        step = max((abs(a - b) for a, b in zip(drawn, drawn[1:])), default=0.0)
        tolerance = max(2 / busy.num_blocks, step)
        busy_scrapes = [usage for usage in scrapes if usage > 0]
        assert busy_scrapes and any(min(abs(scraped - u) for u in drawn) <= tolerance
                                    for scraped in busy_scrapes), (busy_scrapes[-10:], drawn[-10:])
        assert await wait_for(pilot, lambda: state.stats.num_running == 0
                              and state.stats.kv_cache_usage == 0.0, timeout=20)
        # The block map and the server's /metrics agree once the server is idle.
        assert math.isclose(server_kv_usage(kvdeck_server), state.stats.kv_cache_usage)
        assert state.stats.num_cached_blocks > 0  # freed full blocks stay prefix-cached
        assert state.stats.num_requests_finished >= 6
