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


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus exposition."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{labels}")


def raw_stream_events(base_url: str, body: dict, events: list[str]) -> None:
    """Read an SSE stream to its end, keeping every `data:` payload."""
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])

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

    raw_events: list[str] = []
    raw_body = {"prompt": "hi", "max_tokens": 480, "stream": True, "ignore_eos": True}
    threads = [threading.Thread(target=stream_until_error), threading.Thread(target=non_stream),
               threading.Thread(target=raw_stream_events, args=(server.base_url, raw_body, raw_events))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while not results.get("started") or len(raw_events) < 3:
        assert time.monotonic() < deadline, "the streams did not start"
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
    # the raw stream ended with an error event, then [DONE]
    assert raw_events[-1] == "[DONE]" and '"error"' in raw_events[-2], raw_events[-3:]
    # new work is refused with an OpenAI error, quickly, saying when to come back
    response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=5)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert int(response.headers["retry-after"]) >= RESTART_DELAY
    # the rest of the server still answers, and the metrics count the lost requests
    metrics = httpx.get(f"{server.base_url}/metrics")
    assert metrics.status_code == 200
    assert metric(metrics.text, "vllm:request_success_total", finished_reason="error") == 3
    assert metric(metrics.text, "kvdeck:request_errors_total") == 3
    assert "_created" not in metrics.text
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
