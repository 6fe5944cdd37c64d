"""SIGTERM drains: new requests are refused, streams run on for the grace period, then every
stream still open ends with an SSE error event and [DONE]; the server and its engine exit."""

import signal
import threading
import time

import httpx
import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(120)
GRACE_S = 1.5


def stream_events(base_url: str, body: dict, out: list[str], accepted: list[int] | None = None) -> None:
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as response:
            if accepted is not None and response.status_code == 200:
                accepted.append(1)  # the stream's headers: the server has the request
            for line in response.iter_lines():
                if line.startswith("data: "):
                    out.append(line[6:])
    except Exception as exc:  # kept for the assertion message
        out.append(f"raised {type(exc).__name__}: {exc}")


def queued(base_url: str) -> int:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    line = next(li for li in text.splitlines() if li.startswith("vllm:num_requests_waiting{"))
    return int(float(line.rsplit(" ", 1)[1]))


def test_sigterm_drains_then_ends_streams_with_an_error_event(serve_model_dir, tmp_path):
    # One sequence at a time: the long streams queue up behind each other past the grace.
    server = start_server(serve_model_dir, tmp_path, "--max-num-seqs", "1",
                          "--shutdown-grace-period", str(GRACE_S))
    try:
        long = {"prompt": "hello", "max_tokens": 480, "ignore_eos": True, "stream": True}
        short = {**long, "max_tokens": 4}
        # Forty long streams queued behind each other: about 19,000 tokens, several times what
        # this machine decodes in the grace period with the tiny model (three, then eleven,
        # stopped being enough as decoding got faster).
        streams = [[] for _ in range(41)]
        accepted: list[int] = []
        threads = [threading.Thread(target=stream_events, args=(server.base_url, body, events, accepted))
                   for body, events in zip([short] + [long] * 40, streams)]
        for thread in threads:
            thread.start()
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        # Every request in (a late one would be refused by the draining server), some queued.
        while len(accepted) < len(threads) or len(streams[1]) < 3 or queued(server.base_url) < 2:
            assert time.monotonic() < deadline, "the streams did not start"
            time.sleep(0.01)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        with pytest.raises(httpx.TransportError):  # no new connections once draining
            httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=5)
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), "a stream hung after SIGTERM"
        server.process.wait(GRACE_S + 15)
        took = time.monotonic() - sent
    finally:
        stop_server(server, hard=server.process.poll() is None)
    assert streams[0][-1] == "[DONE]" and '"error"' not in streams[0][-2]  # finished in time
    print("LAST", [e[-1][:200] if e else None for e in streams])
    cut = [events for events in streams[1:] if "\"error\"" in events[-2]]
    assert cut, "no stream outlived the grace period; make the streams longer"
    for events in streams[1:]:
        assert events[-1] == "[DONE]"
    assert all("shutting down" in events[-2] for events in cut)
    assert took < GRACE_S + 10, f"the server took {took:.1f} s to exit"
