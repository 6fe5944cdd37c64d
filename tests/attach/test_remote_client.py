"""The attach client against a live `kvdeck --serve` on loopback, a vLLM-style fake, a
server that goes away and one that never answers."""

import asyncio
import socket
import time

import httpx
import pytest

from kvdeck.app.attach import remote_client
from kvdeck.app.attach.connection import RemoteAuthError, normalise_url
from kvdeck.app.attach.openai_reply import UNKNOWN_TOKEN_ID
from kvdeck.app.attach.remote_client import RemoteClient
from kvdeck.engine.api.async_llm import EngineStartError
from kvdeck.engine.types.sampling_params import SamplingParams
from tests.attach import fake_kvdeck, fake_vllm
from tests.serve.conftest import free_port, start_server, stop_server

API_KEY = "attach-secret"
MESSAGES = [{"role": "user", "content": "Tell me about paged attention."}]


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("attach_logs"), api_key=API_KEY)
    yield live
    stop_server(live)


@pytest.fixture
async def client(server):
    attached = RemoteClient(server.base_url, api_key=API_KEY)
    await attached.start()
    yield attached
    await attached.shutdown()


async def next_stats(stream, until, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    async for stats in stream:
        if until(stats):
            return stats
        assert time.monotonic() < deadline, "the stats stream never showed the expected state"
    raise AssertionError("the stats stream ended")


def test_urls_normalise():
    assert normalise_url("localhost:8000") == "http://localhost:8000"
    assert normalise_url("https://box:9/v1/") == "https://box:9"
    with pytest.raises(ValueError, match="not an http"):
        normalise_url("ftp://box")


async def test_attaches_to_kvdeck_and_chat_streams_the_servers_tokens(client, server):
    assert client.kind == "kvdeck" and client.engine_label == "kvdeck"
    info = httpx.get(f"{server.base_url}/kvdeck/v1/info", headers=server.headers).json()
    assert (client.num_blocks, client.max_model_len) == (info["num_blocks"], info["max_model_len"])
    assert client.health().status == "ready"
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = [out async for out in client.generate(None, params, messages=MESSAGES)]
    final = outputs[-1]
    assert final.finished and final.outputs[0].finish_reason == "length"
    assert len(outputs) > 2 and all(not out.finished for out in outputs[:-1])
    # The same request without streaming: same text, and the ids the server generated.
    whole = httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers, json={
        "messages": MESSAGES, "temperature": 0, "max_tokens": 12, "ignore_eos": True,
        "return_token_ids": True}, timeout=60).json()
    assert final.outputs[0].text == whole["choices"][0]["message"]["content"]
    assert final.outputs[0].token_ids == whole["choices"][0]["token_ids"]
    assert final.prompt_token_ids == whole["prompt_token_ids"]
    assert client.encode(None, MESSAGES)[1] == whole["prompt_token_ids"]
    assert final.metrics.time_to_first_token is not None


async def test_completions_with_a_token_prompt(client):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    outputs = [out async for out in client.generate([1, 2, 3, 4], params)]
    assert outputs[-1].prompt_token_ids == [1, 2, 3, 4]
    assert len(outputs[-1].outputs[0].token_ids) == 5
    assert UNKNOWN_TOKEN_ID not in outputs[-1].outputs[0].token_ids


async def test_stats_stream_shows_a_request_and_its_blocks_freed_after_abort(client):
    stream = client.stats_stream()
    await next_stats(stream, lambda s: True)  # connected before the request: its TTFT is ours
    params = SamplingParams(temperature=0.0, max_tokens=client.max_model_len - 40, ignore_eos=True)
    reply = client.generate(None, params, request_id="attach-long", messages=MESSAGES)
    first = await anext(reply)  # running now
    busy = await next_stats(stream, lambda s: any(r.block_table for r in s.requests))
    assert busy.num_blocks == client.num_blocks
    assert sum(1 for count in busy.block_ref_counts if count) >= len(busy.requests[0].block_table)
    await client.abort("attach-long")
    rest = [out async for out in reply]
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert len(rest[-1].outputs[0].token_ids) >= len(first.outputs[0].token_ids)
    idle = await next_stats(stream, lambda s: not s.requests and s.num_free_blocks == s.num_blocks)
    assert idle.kv_cache_usage == 0.0
    assert any(kind in ("ttft", "itl") for kind, _, _ in client.drain_latencies())
    await stream.aclose()


async def test_a_finished_request_arrives_with_its_final_figures(client):
    """What the attached dashboard's row of a finished request shows (its last snapshot
    predates its last steps)."""
    stream = client.stats_stream()
    await next_stats(stream, lambda s: True)
    client.drain_ended()  # earlier tests' requests
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = [out async for out in client.generate(None, params, messages=MESSAGES)]
    ended = []
    await next_stats(stream, lambda s: bool(ended.extend(client.drain_ended()) or ended))
    (final,) = ended
    assert final.state == "finished" and final.num_output_tokens == 6
    assert final.num_prompt_tokens == len(outputs[-1].prompt_token_ids)
    assert final.num_computed_tokens == final.num_prompt_tokens + 5
    await stream.aclose()


async def test_a_request_the_server_refuses_is_a_value_error(client):
    params = SamplingParams(temperature=0.0, max_tokens=client.max_model_len * 4)
    with pytest.raises(ValueError, match="max_model_len is 512"):
        async for _ in client.generate(None, params, messages=MESSAGES * 400):
            pass


async def test_a_wrong_key_is_named(server):
    attached = RemoteClient(server.base_url, api_key="wrong")
    with pytest.raises(RemoteAuthError, match="refused the API key.*--api-key"):
        await attached.start()
    await attached.shutdown()


async def test_an_unreachable_server_is_a_start_error():
    attached = RemoteClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(EngineStartError, match="cannot reach"):
        await attached.start()
    assert attached.health().status == "dead"
    await attached.shutdown()


async def test_vllm_style_server_gets_metrics_and_a_chat_without_token_ids():
    metrics = fake_vllm.VllmMetrics()
    running = fake_vllm.serve(fake_vllm.create_app(metrics))
    attached = RemoteClient(running.url)
    try:
        await attached.start()
        assert (attached.kind, attached.engine_label) == ("openai", "vLLM")
        assert attached.model_name == fake_vllm.MODEL and attached.max_model_len == 4096
        assert [s async for s in attached.stats_stream()] == []  # no block map from vLLM
        metrics.kv.labels(model_name=fake_vllm.MODEL, engine="0").set(0.25)
        views = attached.metrics_stream(interval_s=0.05)
        view = await anext(views)
        assert view.kv_cache_usage == pytest.approx(0.25)
        await views.aclose()
        params = SamplingParams(temperature=0.0, max_tokens=16)
        outputs = [out async for out in attached.generate(None, params, messages=MESSAGES)]
        assert outputs[-1].outputs[0].text == "".join(fake_vllm.REPLY)
        assert outputs[-1].outputs[0].token_ids == [UNKNOWN_TOKEN_ID] * len(fake_vllm.REPLY)
    finally:
        await attached.shutdown()
        running.stop()


async def test_disconnect_shows_dead_then_reconnects(monkeypatch):
    """The server goes away: health says so (and when it retries), the last figures stay;
    it comes back on the same port: the stream resumes by itself."""
    monkeypatch.setattr(remote_client, "STATS_STALL_S", 2.0)
    port = free_port()
    running = fake_vllm.serve(fake_kvdeck.create_app(), port)
    attached = RemoteClient(running.url)
    await attached.start()
    assert attached.kind == "kvdeck" and attached.num_blocks == fake_kvdeck.NUM_BLOCKS
    received: list = []

    async def consume():
        async for stats in attached.stats_stream():
            received.append(stats)

    async def wait_for(condition, what: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what}: {attached.health()}"
            await asyncio.sleep(0.05)

    reader = asyncio.ensure_future(consume())
    try:
        await wait_for(lambda: received, "no stats at all")
        await asyncio.to_thread(running.stop)
        await wait_for(lambda: attached.health().status == "dead", "never noticed")
        assert "retrying in" in attached.health().detail
        assert attached.last_stats is not None  # the last figures stay for the dashboard
        await asyncio.sleep(1.0)  # a retry or two against a closed port
        seen = len(received)
        running = await asyncio.to_thread(fake_vllm.serve, fake_kvdeck.create_app(), port)
        await wait_for(lambda: len(received) > seen, "never reconnected")
        assert attached.health().status == "ready"
    finally:
        reader.cancel()
        await attached.shutdown()
        await asyncio.to_thread(running.stop)


async def test_a_server_that_never_answers_does_not_block_the_loop(monkeypatch):
    """The listener accepts and says nothing: reads time out, the loop keeps ticking."""
    monkeypatch.setattr(remote_client, "STATS_STALL_S", 0.5)
    monkeypatch.setattr(remote_client, "REQUEST_TIMEOUT_S", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    attached = RemoteClient(f"127.0.0.1:{silent.getsockname()[1]}")
    attached.kind = "kvdeck"  # as if start() had found kvdeck before the server hung
    attached.has_metrics = True
    gaps, last = [], time.monotonic()

    async def ticker():
        nonlocal last
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    feeds = [asyncio.ensure_future(anext(attached.stats_stream())),
             asyncio.ensure_future(anext(attached.metrics_stream()))]
    await asyncio.sleep(2.5)
    assert attached.health().status == "dead"
    assert "stopped answering" in attached.health().detail
    for task in (*feeds, ticking):
        task.cancel()
    await attached.shutdown()
    silent.close()
    assert max(gaps) < 0.25, f"the event loop stalled {max(gaps) * 1000:.0f} ms"
