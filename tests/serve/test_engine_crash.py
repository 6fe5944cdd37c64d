"""Killing the engine process: streams end with an error, /health turns 503, nothing hangs,
and the server starts a new engine and serves again."""

import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(150)
RESTART_DELAY = 6


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    # A restart delay long enough to observe the dead engine first.
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("serve_logs"),
                        "--engine-restart-delay", str(RESTART_DELAY))
    yield live
    stop_server(live)  # also checks that the server still shuts down cleanly


def test_engine_death_is_an_error_not_a_hang(server):
    api = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                        timeout=30)
    engine = server.engine_pid()
    assert engine is not None
    results: dict[str, object] = {}

    def stream_until_error() -> None:
        chunks = 0
        try:
            stream = api.completions.create(model=api.models.list().data[0].id, prompt="hello",
                                            max_tokens=480, stream=True,
                                            extra_body={"ignore_eos": True})
            for _ in stream:
                chunks += 1
                if chunks == 3:
                    results["started"] = True
            results["outcome"] = "finished"
        except openai.APIError as exc:
            results["outcome"] = exc
        results["chunks"] = chunks

    def non_stream() -> None:
        try:
            api.completions.create(model=api.models.list().data[0].id, prompt="hi",
                                   max_tokens=480, extra_body={"ignore_eos": True})
            results["plain"] = "finished"
        except openai.APIStatusError as exc:
            results["plain"] = exc

    threads = [threading.Thread(target=stream_until_error), threading.Thread(target=non_stream)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while not results.get("started"):
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.01)
    os.kill(engine, signal.SIGKILL)
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive(), "a request hung after the engine died"

    outcome = results["outcome"]
    assert isinstance(outcome, openai.APIError), outcome
    assert "engine" in str(outcome)
    plain = results["plain"]
    assert isinstance(plain, openai.APIStatusError) and plain.status_code == 503, plain

    health = httpx.get(f"{server.base_url}/health")
    assert health.status_code == 503
    assert health.json()["status"] == "dead" and "SIGKILL" in health.json()["detail"]
    # new work is refused with an OpenAI error, quickly
    response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=5)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_unavailable"
    # the rest of the server still answers
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 200


def test_the_engine_comes_back_after_a_crash(server):
    # Runs after the test above killed the engine.
    deadline = time.monotonic() + RESTART_DELAY + 60
    while httpx.get(f"{server.base_url}/health").status_code != 200:
        assert time.monotonic() < deadline, f"the engine was not restarted:\n{server.log()}"
        time.sleep(0.3)
    api = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                        timeout=30)
    reply = api.completions.create(model=api.models.list().data[0].id, prompt="hello", max_tokens=4,
                                   extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 4
    assert "restarting it in" in server.log()
