"""The dashboard's feed over HTTP (GET /kvdeck/v1/stats): the engine's snapshots and the
latencies as Server-Sent Events, behind the API key like /v1."""

import json
import threading

import httpx
import pytest

from kvdeck.engine.types.stats import request_stats_from_dict, stats_from_dict
from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(120)
KEY = "sk-stats"


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("stats_logs"), api_key=KEY)
    yield live
    stop_server(live)


def read_events(server, until, limit: int = 400) -> list[tuple[str, dict]]:
    events, kind = [], "message"
    with httpx.stream("GET", f"{server.base_url}/kvdeck/v1/stats", headers=server.headers,
                      timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
                if until(events) or len(events) >= limit:
                    return events
    return events


def test_the_stream_needs_the_key(server):
    assert httpx.get(f"{server.base_url}/kvdeck/v1/stats", timeout=5).status_code == 401
    info = httpx.get(f"{server.base_url}/kvdeck/v1/info", headers=server.headers, timeout=5).json()
    assert info["engine"] == "kvdeck" and info["num_blocks"] > 0 and info["health"] == "ready"


def test_snapshots_show_a_request_and_its_latencies(server):
    def load() -> None:
        body = {"prompt": "hello", "max_tokens": 200, "ignore_eos": True}
        httpx.post(f"{server.base_url}/v1/completions", json=body, headers=server.headers, timeout=60)

    worker = threading.Timer(0.3, load)
    worker.start()

    def seen(events) -> bool:
        snapshots = [d for k, d in events if k == "stats"]
        running = any(d["stats"]["num_running"] for d in snapshots)
        latencies = {kind for d in snapshots for kind, _, _ in d["latencies"]}
        return running and {"ttft", "itl"} <= latencies

    events = read_events(server, seen)
    worker.join(60)
    assert events[0][0] == "info" and events[0][1]["max_model_len"] > 0
    snapshots = [stats_from_dict(d["stats"]) for k, d in events if k == "stats"]
    busy = next(s for s in snapshots if s.num_running)
    assert len(busy.block_ref_counts) == busy.num_blocks
    assert "kernel_compiles_total" in next(d for k, d in events if k == "stats")["stats"]
    assert busy.kernel_compiles_total == 0  # the CPU engine compiles no kernel
    (request,) = busy.requests
    assert request.block_table and all(busy.block_ref_counts[b] >= 1 for b in request.block_table)
    assert seen(events)


def test_a_finished_request_comes_with_its_final_figures(server):
    """The snapshot that last listed a request predates its last steps; the event after it
    ends carries its final counts and timeline (what an attached dashboard's row shows)."""
    outcome: dict = {}

    def load() -> None:
        body = {"prompt": "hello", "max_tokens": 24, "ignore_eos": True}
        outcome["reply"] = httpx.post(f"{server.base_url}/v1/completions", json=body,
                                      headers=server.headers, timeout=60).json()

    worker = threading.Timer(0.3, load)
    worker.start()
    events = read_events(server, lambda events: any(d.get("ended") for k, d in events
                                                    if k == "stats"))
    worker.join(60)
    (entry,) = [e for k, d in events if k == "stats" for e in d.get("ended", [])]
    final = request_stats_from_dict(entry)
    usage = outcome["reply"]["usage"]
    assert final.state == "finished" and final.num_output_tokens == 24
    assert final.num_prompt_tokens == usage["prompt_tokens"]
    assert final.num_computed_tokens == usage["prompt_tokens"] + 23
    assert final.timeline is not None and final.timeline.finish_reason == "length"
