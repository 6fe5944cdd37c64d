"""GET /kvdeck/v1/requests/{id}: a request's timeline, TTFT parts and reason line, live and
after it finished; 404 in OpenAI's shape for an unknown id; behind the API key."""

import json
import time

import httpx
import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(120)
KEY = "sk-timeline"


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("timeline_logs"), api_key=KEY)
    yield live
    stop_server(live)


def _get(server, request_id: str, headers=None) -> httpx.Response:
    return httpx.get(f"{server.base_url}/kvdeck/v1/requests/{request_id}",
                     headers=server.headers if headers is None else headers, timeout=10)


def test_a_finished_completion_has_its_timeline(server):
    body = {"prompt": "hello there", "max_tokens": 12, "ignore_eos": True}
    reply = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=server.headers,
                       timeout=60).json()
    found = _get(server, reply["id"])  # the completion's id names its first choice
    assert found.status_code == 200
    data = found.json()
    assert data["id"] == f"{reply['id']}-0" and data["state"] == "finished"
    assert data["reason"] == "finished: length"
    timeline = data["timeline"]
    assert [phase for _, phase in timeline["phases"]] == ["queued", "prefill", "decode", "finished"]
    assert sum(tokens for _, tokens, _ in timeline["prefill_chunks"]) == reply["usage"]["prompt_tokens"]
    assert sum(run[2] for run in timeline["decode_runs"]) == 11  # the first token came from the prefill
    ttft = data["ttft"]
    assert ttft["total_s"] == pytest.approx(ttft["queue_s"] + ttft["prefill_s"] + ttft["first_step_s"])
    assert [phase for phase, _ in timeline["durations"]] == ["queued", "prefill", "decode"]


def test_a_live_request_has_its_reason_line(server):
    body = {"prompt": "hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body,
                      headers=server.headers, timeout=60) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        request_id = json.loads(first[6:])["id"]
        # From the latest snapshot: one that shows it comes within a snapshot interval or two.
        for _ in range(40):
            found = _get(server, request_id)
            if found.status_code == 200:
                break
            time.sleep(0.025)
        data = found.json()
    assert data["state"] in ("prefilling", "decoding", "waiting")
    assert data["reason"].startswith(("decoding: ", "prefill: ", "waiting: "))
    assert data["timeline"]["phases"][0][1] == "queued"


def test_unknown_ids_get_404_and_the_route_needs_the_key(server):
    missing = _get(server, "cmpl-nope")
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "request_not_found" and "cmpl-nope" in error["message"]
    assert _get(server, "cmpl-nope", headers={}).status_code == 401
    assert _get(server, "cmpl-nope", headers={"Authorization": "Bearer wrong"}).status_code == 401
