"""Bad requests get OpenAI error objects with the right status and disturb nobody; auth; 429."""

import asyncio

import httpx
import pytest

from kvdeck.app.cli import build_parser, engine_kwargs_from_args
from kvdeck.app.serve.server import is_loopback, run_server
from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(120)

KEY = "sk-test-secret"
ORIGIN = "http://localhost:3000"
MODEL = "tiny"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
GOOD_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
GOOD_COMP = {"model": MODEL, "prompt": "hello", "max_tokens": 3}


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    # One sequence at a time and a queue of 2, so the queue limit is easy to reach.
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("serve_logs"),
                        "--served-model-name", MODEL, "--max-queue-len", "2",
                        "--max-num-seqs", "1", "--allowed-origins", ORIGIN, api_key=KEY)
    yield live
    stop_server(live, hard=True)  # a killed server must not leave its engine behind


def with_(base: dict, **changes) -> dict:
    body = {**base, **changes}
    return {k: v for k, v in body.items() if v is not ...}


HUGE_PROMPT = "The quick brown fox jumps over the lazy dog. " * 200  # >> max_model_len 512

# (name, path, body (dict, or raw bytes), headers override, status, param)
BAD_REQUESTS = [
    ("malformed json", COMP, b'{"prompt": "hi", ', None, 400, None),
    ("body not an object", COMP, b'["hi"]', None, 400, None),
    ("negative max_tokens", COMP, with_(GOOD_COMP, max_tokens=-5), None, 400, "max_tokens"),
    ("zero max_tokens", CHAT, with_(GOOD_CHAT, max_tokens=0), None, 400, "max_tokens"),
    ("temperature hot", CHAT, with_(GOOD_CHAT, temperature="hot"), None, 400, "temperature"),
    ("negative temperature", COMP, with_(GOOD_COMP, temperature=-1), None, 400, "temperature"),
    ("top_p 2", CHAT, with_(GOOD_CHAT, top_p=2), None, 400, "top_p"),
    ("top_k -5", COMP, with_(GOOD_COMP, top_k=-5), None, 400, "top_k"),
    ("presence_penalty 3", COMP, with_(GOOD_COMP, presence_penalty=3), None, 400,
     "presence_penalty"),
    ("max_tokens as string", COMP, with_(GOOD_COMP, max_tokens="5"), None, 400, "max_tokens"),
    ("huge prompt", COMP, with_(GOOD_COMP, prompt=HUGE_PROMPT), None, 400, "prompt"),
    ("prompt + max_tokens over context", COMP, with_(GOOD_COMP, max_tokens=600), None, 400,
     "max_tokens"),
    ("huge chat", CHAT, with_(GOOD_CHAT, messages=[{"role": "user", "content": HUGE_PROMPT}]),
     None, 400, "messages"),
    ("stop_token_ids out of vocab", COMP, with_(GOOD_COMP, stop_token_ids=[10**6]), None, 400,
     "stop_token_ids"),
    ("unknown model", CHAT, with_(GOOD_CHAT, model="gpt-4"), None, 404, "model"),
    ("missing messages", CHAT, with_(GOOD_CHAT, messages=...), None, 400, "messages"),
    ("empty messages", CHAT, with_(GOOD_CHAT, messages=[]), None, 400, "messages"),
    ("wrong role", CHAT, with_(GOOD_CHAT, messages=[{"role": "wizard", "content": "x"}]), None,
     400, "messages.0.role"),
    ("missing prompt", COMP, with_(GOOD_COMP, prompt=...), None, 400, "prompt"),
    ("empty prompt", COMP, with_(GOOD_COMP, prompt=""), None, 400, "prompt"),
    ("token id out of vocab", COMP, with_(GOOD_COMP, prompt=[1, 2, 999999]), None, 400, "prompt"),
    ("n=0", CHAT, with_(GOOD_CHAT, n=0), None, 400, "n"),
    ("top_logprobs without logprobs", CHAT, with_(GOOD_CHAT, top_logprobs=2), None, 400,
     "top_logprobs"),
    ("logprobs 50", COMP, with_(GOOD_COMP, logprobs=50), None, 400, "logprobs"),
    ("bad api key", CHAT, GOOD_CHAT, {"Authorization": "Bearer wrong"}, 401, None),
    ("no api key", COMP, GOOD_COMP, {}, 401, None),
    ("unknown route", "/v1/audio/speech", GOOD_COMP, None, 404, None),
]


@pytest.mark.parametrize("name,path,body,headers,status,param", BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request(server, name, path, body, headers, status, param):
    sent_headers = server.headers if headers is None else headers
    if isinstance(body, bytes):
        response = httpx.post(server.base_url + path, content=body,
                              headers={**sent_headers, "Content-Type": "application/json"})
    else:
        response = httpx.post(server.base_url + path, json=body, headers=sent_headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    if name.startswith("huge"):
        assert error["code"] == "context_length_exceeded"
    # and the server still answers a good request
    good = httpx.post(server.base_url + COMP, json=GOOD_COMP, headers=server.headers)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3


def test_the_key_passes_in_x_api_key_as_anthropics_clients_send_it(server):
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": KEY},
                       timeout=60)
    assert reply.status_code == 200 and reply.json()["type"] == "message"
    assert httpx.post(server.base_url + CHAT, json=GOOD_CHAT, headers={"x-api-key": KEY},
                      timeout=60).status_code == 200
    for headers in ({"x-api-key": "wrong"}, {}, {"Authorization": "Bearer wrong",
                                                 "x-api-key": "wrong"}):
        refused = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"  # Anthropic's shape


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/metrics").status_code == 200
    assert httpx.get(server.base_url + "/v1/models").status_code == 401
    models = httpx.get(server.base_url + "/v1/models", headers=server.headers).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


async def test_full_queue_answers_429(server):
    long = with_(GOOD_COMP, max_tokens=150, ignore_eos=True)
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers,
                                 timeout=60) as http:
        responses = await asyncio.gather(*(http.post(COMP, json=long) for _ in range(8)))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes, codes
        assert set(codes) == {200, 429}
        rejected = next(r for r in responses if r.status_code == 429)
        assert rejected.json()["error"]["code"] == "queue_full"
        for r in responses:
            if r.status_code == 200:
                assert r.json()["usage"]["completion_tokens"] == 150
        again = await http.post(COMP, json=GOOD_COMP)
        assert again.status_code == 200


def test_non_loopback_bind_needs_a_key(serve_model_dir, capsys, monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    monkeypatch.delenv("KVDECK_API_KEY", raising=False)
    args = build_parser().parse_args(["--serve", "--host", "0.0.0.0", "--model",
                                      str(serve_model_dir)])
    assert run_server(args, engine_kwargs_from_args(args)) == 2  # refused before loading
    err = capsys.readouterr().err
    assert "--allow-insecure-bind" in err and "--api-key" in err


def test_a_taken_port_fails_before_the_engine_loads(serve_model_dir, capsys, monkeypatch):
    import socket

    import kvdeck.app.serve.server as server_module
    from kvdeck.app.cli import main

    started = []
    monkeypatch.setattr(server_module, "AsyncLLM", lambda *a, **k: started.append(a))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--serve", "--model", str(serve_model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}: in use" in err and "--port" in err
    assert started == []  # no engine was made for a server that could not listen
    assert main(["--serve", "--model", str(serve_model_dir), "--host", "nosuch.invalid",
                 "--allow-insecure-bind"]) == 2
    assert "--host nosuch.invalid: cannot resolve it" in capsys.readouterr().err


def test_cors_for_allowed_origins_only(server):
    # A browser's preflight carries no key; it must pass, and only for the allowed origin.
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    response = httpx.options(f"{server.base_url}{CHAT}", headers=preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server.base_url}{CHAT}",
                          headers={**preflight, "Origin": "http://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # The real request still needs the key, and carries the CORS header either way.
    denied = httpx.post(f"{server.base_url}{COMP}", json=GOOD_COMP, headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    allowed = httpx.post(f"{server.base_url}{COMP}", json=GOOD_COMP,
                         headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"}, timeout=30)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_content_part_that_is_not_text_is_named_in_the_error(kind):
    """Not "should be a valid string", which is what the content's union said on its own."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from kvdeck.app.serve.errors import _from_validation
    from kvdeck.app.serve.protocol import ChatCompletionRequest

    body = with_(GOOD_CHAT, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": kind, kind: {"url": "http://x"}}]}])
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    error = _from_validation(RequestValidationError(caught.value.errors()))
    assert error.param == "messages.0.content"
    assert str(error.message).startswith(f"messages.0.content: content parts of type '{kind}' "
                                         "are not supported: kvdeck's models read text only"), error
    text_only = with_(GOOD_CHAT, messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert ChatCompletionRequest.model_validate(text_only).messages[0].text() == "ab"
