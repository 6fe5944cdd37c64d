"""Hostile requests against a live server: each gets its documented 4xx with an OpenAI error
object, never a 5xx, and a good request and /health still answer correctly after each."""

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
QUEUE = 16
BODY_LIMIT = 1 << 20  # --max-request-body-mb 1
USER = {"role": "user", "content": "hi"}
GOOD_CHAT = {"model": MODEL, "messages": [USER], "max_tokens": 2}
GOOD_COMP = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
JSON = {"Content-Type": "application/json"}


def chat(**changes) -> dict:
    return {**GOOD_CHAT, **changes}


def comp(**changes) -> dict:
    return {**GOOD_COMP, **changes}


def raw(text: str) -> bytes:
    return text.encode("utf-8")


# (name, method, path, body: dict | bytes | None, headers, status)
HOSTILE = [
    # types
    ("temperature a string", "POST", CHAT, chat(temperature="hot"), JSON, 400),
    ("max_tokens a string", "POST", COMP, comp(max_tokens="5"), JSON, 400),
    ("n a float", "POST", CHAT, chat(n=1.5), JSON, 400),
    ("seed a float", "POST", COMP, comp(seed=1.0), JSON, 400),
    ("stop a number", "POST", COMP, comp(stop=5), JSON, 400),
    ("stream a string", "POST", CHAT, chat(stream="yes"), JSON, 400),
    ("messages a string", "POST", CHAT, chat(messages="hi"), JSON, 400),
    ("messages of strings", "POST", CHAT, chat(messages=["hi"]), JSON, 400),
    ("prompt an object", "POST", COMP, comp(prompt={}), JSON, 400),
    ("prompt of floats", "POST", COMP, comp(prompt=[1.5, 2.5]), JSON, 400),
    ("model a number", "POST", CHAT, chat(model=123), JSON, 400),
    ("body null", "POST", CHAT, b"null", JSON, 400),
    ("body a number", "POST", COMP, b"42", JSON, 400),
    ("body empty", "POST", CHAT, b"", JSON, 400),
    ("logit_bias of a word", "POST", COMP, comp(logit_bias={"yes": 5}), JSON, 400),
    ("logit_bias over 100", "POST", COMP, comp(logit_bias={"1": 101}), JSON, 400),
    ("logit_bias beyond the vocabulary", "POST", CHAT, chat(logit_bias={"99999999": 5}), JSON, 400),
    ("top_logprobs without logprobs", "POST", CHAT, chat(top_logprobs=2), JSON, 400),
    ("tool_choice naming no tool", "POST", CHAT, chat(
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice={"type": "function", "function": {"name": "g"}}), JSON, 400),
    ("tools and a regex on a template without tools", "POST", CHAT, chat(
        tools=[{"type": "function", "function": {"name": "f"}}], guided_regex="a+"), JSON, 400),
    # ranges
    ("seed 2^64", "POST", CHAT, chat(temperature=1, seed=2**64), JSON, 400),
    ("seed below -2^63", "POST", COMP, comp(seed=-(2**63) - 1), JSON, 400),
    ("top_k 2^63", "POST", COMP, comp(top_k=2**63, top_p=0.5), JSON, 400),
    ("top_k -2", "POST", COMP, comp(top_k=-2), JSON, 400),
    ("temperature 2.5", "POST", CHAT, chat(temperature=2.5), JSON, 400),
    ("temperature Infinity", "POST", CHAT, raw('{"messages":[{"role":"user","content":"x"}],'
                                               '"temperature":Infinity}'), JSON, 400),
    ("temperature NaN", "POST", COMP, raw('{"prompt":"x","temperature":NaN}'), JSON, 400),
    ("top_p 0", "POST", CHAT, chat(top_p=0), JSON, 400),
    ("top_p 1.5", "POST", COMP, comp(top_p=1.5), JSON, 400),
    ("min_p -0.1", "POST", COMP, comp(min_p=-0.1), JSON, 400),
    ("presence_penalty -3", "POST", CHAT, chat(presence_penalty=-3), JSON, 400),
    ("repetition_penalty 0", "POST", COMP, comp(repetition_penalty=0), JSON, 400),
    ("max_tokens 0", "POST", CHAT, chat(max_tokens=0), JSON, 400),
    ("max_tokens 2^63", "POST", COMP, comp(max_tokens=2**63), JSON, 400),
    ("min_tokens over max_tokens", "POST", COMP, comp(min_tokens=5, max_tokens=2), JSON, 400),
    ("n 0", "POST", CHAT, chat(n=0), JSON, 400),
    ("n 1000000", "POST", COMP, comp(n=1_000_000), JSON, 400),
    ("n beyond the queue", "POST", COMP, comp(n=QUEUE + 1), JSON, 400),
    ("prompts x n beyond the queue", "POST", COMP, comp(prompt=["a", "b", "c"], n=6), JSON, 400),
    ("logprobs 21", "POST", COMP, comp(logprobs=21), JSON, 400),
    ("stop_token_ids -1", "POST", COMP, comp(stop_token_ids=[-1]), JSON, 400),
    ("stop_token_ids 2^64", "POST", CHAT, chat(stop_token_ids=[2**64]), JSON, 400),
    ("stop_token_ids out of vocab", "POST", CHAT, chat(stop_token_ids=[10**6]), JSON, 400),
    ("100 stop strings", "POST", COMP, comp(stop=[f"s{i}" for i in range(100)]), JSON, 400),
    ("a 5000-character stop", "POST", COMP, comp(stop=["x" * 5000]), JSON, 400),
    ("prompt token -1", "POST", COMP, comp(prompt=[1, -1]), JSON, 400),
    ("prompt token 2^70", "POST", COMP, comp(prompt=[2**70]), JSON, 400),
    ("prompt token out of vocab", "POST", COMP, comp(prompt=[1, 999_999]), JSON, 400),
    ("300 prompts", "POST", COMP, comp(prompt=["a"] * 300), JSON, 400),
    ("empty prompt list", "POST", COMP, comp(prompt=[]), JSON, 400),
    # unicode
    ("lone surrogate in a message", "POST", CHAT,
     raw('{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":2}'), JSON, 400),
    ("lone surrogate in a prompt", "POST", COMP, raw('{"prompt":"a\\udc00b","max_tokens":2}'),
     JSON, 400),
    ("lone surrogate to /tokenize", "POST", TOKENIZE, raw('{"prompt":"\\ud83d"}'), JSON, 400),
    ("lone surrogate in /tokenize messages", "POST", TOKENIZE,
     raw('{"messages":[{"role":"user","content":"\\ud800"}]}'), JSON, 400),
    ("invalid UTF-8 bytes", "POST", CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}',
     JSON, 400),
    # roles
    ("tool role without content", "POST", CHAT,
     chat(messages=[USER, {"role": "tool", "content": None, "tool_call_id": "c1"}]), JSON, 400),
    ("user content null", "POST", CHAT, chat(messages=[{"role": "user", "content": None}]), JSON, 400),
    ("unknown role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), JSON, 400),
    ("message without a role", "POST", CHAT, chat(messages=[{"content": "x"}]), JSON, 400),
    ("image content part", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), JSON, 400),
    # sizes
    ("a body over the limit", "POST", COMP, raw(json.dumps(comp(prompt="x" * (BODY_LIMIT + 10)))),
     JSON, 413),
    ("a chunked body over the limit", "POST", COMP, "chunked", JSON, 413),
    ("a prompt far over the context", "POST", COMP, comp(prompt="fox " * 100_000), JSON, 400),
    ("a conversation over the context", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "paged attention " * 500}]), JSON, 400),
    ("5000 messages", "POST", CHAT, chat(messages=[USER] * 5000), JSON, 400),
    ("token prompt over the context", "POST", COMP, comp(prompt=[5] * 600), JSON, 400),
    ("max_tokens over the context", "POST", COMP, comp(max_tokens=600), JSON, 400),
    # nesting
    ("JSON nested 100000 deep", "POST", CHAT, b"[" * 100_000 + b"]" * 100_000, JSON, 400),
    ("an object as content", "POST", CHAT, chat(messages=[{"role": "user", "content": {"a": {"b": 1}}}]),
     JSON, 400),
    # content types and methods
    ("text/plain body", "POST", CHAT, raw(json.dumps(GOOD_CHAT)), {"Content-Type": "text/plain"}, 400),
    ("form body", "POST", COMP, b"prompt=hello", {"Content-Type": "application/x-www-form-urlencoded"}, 400),
    ("malformed JSON", "POST", CHAT, b'{"messages": [', JSON, 400),
    ("GET a POST route", "GET", CHAT, None, {}, 405),
    ("PUT a POST route", "PUT", COMP, raw(json.dumps(GOOD_COMP)), JSON, 405),
    # /tokenize, /detokenize, models
    ("/tokenize with both prompt and messages", "POST", TOKENIZE,
     {"prompt": "a", "messages": [USER]}, JSON, 400),
    ("/detokenize -1", "POST", DETOKENIZE, {"tokens": [-1]}, JSON, 400),
    ("/detokenize strings", "POST", DETOKENIZE, {"tokens": ["a"]}, JSON, 400),
    ("/detokenize out of vocab", "POST", DETOKENIZE, {"tokens": [10**6]}, JSON, 400),
    ("unknown model", "POST", CHAT, chat(model="gpt-4o"), JSON, 404),
    ("unknown route", "POST", "/v1/audio/speech", comp(), JSON, 404),
]


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("hostile_logs"),
                        "--served-model-name", MODEL, "--max-queue-len", str(QUEUE),
                        "--max-request-body-mb", str(BODY_LIMIT / (1 << 20)))
    yield live
    stop_server(live)


def chunked_post(base_url: str, path: str, body: bytes) -> tuple[int, dict]:
    """A POST with Transfer-Encoding: chunked (no Content-Length), over a raw socket."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
        try:
            for start in range(0, len(body), 64 << 10):
                piece = body[start:start + (64 << 10)]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the end of the body: fine
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"chunked" in head.lower():  # the answer itself may be chunked
        payload = b"".join(payload.split(b"\r\n")[1::2])
    return status, json.loads(payload)


@pytest.mark.parametrize("name,method,path,body,headers,status", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_request(server, name, method, path, body, headers, status):
    if body == "chunked":
        got, payload = chunked_post(server.base_url, path,
                                    raw(json.dumps(comp(prompt="y" * (BODY_LIMIT * 2)))))
    else:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = httpx.request(method, server.base_url + path, headers=headers, timeout=60,
                                 **({} if body is None else kwargs))
        got, payload = response.status_code, response.json()
        if status == 405:
            assert "POST" in response.headers.get("allow", ""), "a 405 names the allowed method"
    assert got == status, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"} and payload["error"]["message"]
    # nobody else is hurt: a good request and the health probe still answer
    good = httpx.post(server.base_url + CHAT, json=GOOD_CHAT, timeout=60)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ready"


def test_the_table_is_long_enough():
    assert len(HOSTILE) >= 60


def test_edge_values_that_are_fine(server):
    """At the edges of what is allowed: served, not refused."""
    for body in (chat(temperature=1e-50), chat(seed=2**63 - 1, temperature=1),
                 chat(seed=-(2**63), temperature=1), comp(top_k=2**31 - 1, top_p=0.5),
                 chat(messages=[{"role": "developer", "content": "be brief"}, USER]),
                 comp(n=QUEUE, max_tokens=1)):
        response = httpx.post(server.base_url + (CHAT if "messages" in body else COMP), json=body,
                              timeout=60)
        assert response.status_code == 200, (body, response.text)


def test_greedy_below_the_temperature_floor(server):
    """temperature 1e-50 samples greedily (it used to underflow to 0 and emit garbage)."""
    greedy = httpx.post(server.base_url + COMP, json=comp(max_tokens=8, temperature=0), timeout=60)
    tiny = httpx.post(server.base_url + COMP, json=comp(max_tokens=8, temperature=1e-50), timeout=60)
    assert greedy.json()["choices"][0]["text"] == tiny.json()["choices"][0]["text"]


def test_queue_full_is_429_with_retry_after(server):
    import asyncio

    async def burst():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
            long = comp(max_tokens=60, ignore_eos=True, n=QUEUE)
            return await asyncio.gather(*(http.post(COMP, json=long) for _ in range(3)))

    responses = asyncio.run(burst())
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected, [r.status_code for r in responses]
    assert rejected[0].headers["retry-after"] == "1"
    assert {r.status_code for r in responses} <= {200, 429}
