"""Ollama's API through Ollama's official Python client (`ollama`) against a live `kvdeck
--serve` on the demo model, with an API key; httpx for the error cases and for curl-style
bodies. Replies are checked for Ollama's shapes and for what the request asked (the schema,
the token budget, greedy streams equal to whole replies), never for what the model said."""

import json

import httpx
import jsonschema
import ollama
import pytest

from kvdeck.engine.types.model_path import demo_model_dir
from tests.serve.conftest import start_server, stop_server
from tests.serve.test_openai_api import wait_idle

pytestmark = pytest.mark.timeout(300)

KEY = "ollama-test-key"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
STATS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
         "eval_count", "eval_duration")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start_server(demo_model_dir(), tmp_path_factory.mktemp("ollama_logs"), api_key=KEY)
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def name(server) -> str:
    """The served name, as the server's state has it (the OpenAI route lists it)."""
    return httpx.get(f"{server.base_url}/v1/models", headers=server.headers).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.base_url, headers=server.headers, timeout=120)


def post(server, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers, timeout=120,
                      **kwargs)


def assert_final(reply, max_tokens: int) -> None:
    assert reply.done is True and reply.done_reason in ("stop", "length")
    assert all(isinstance(reply[key], int) for key in STATS)
    assert 0 < reply.eval_count <= max_tokens and reply.prompt_eval_count > 0
    assert reply.eval_duration > 0 and reply.total_duration >= reply.prompt_eval_duration
    assert reply.load_duration == 0


def test_chat_whole_and_streamed_agree(client, name):
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model=f"{name}:latest", messages=USER, options=options)
    assert whole.message.role == "assistant" and whole.model == f"{name}:latest"
    assert_final(whole, 12)
    parts = list(client.chat(model=name, messages=USER, options=options, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].message.content == "" and parts[-1].eval_count == whole.eval_count
    assert_final(parts[-1], 12)


def test_generate_whole_streamed_and_raw(client, name):
    options = {"temperature": 0, "num_predict": 10, "stop": ["\n\n\n"]}
    whole = client.generate(model=name, prompt="Tell me a story.", system="Be brief.", options=options)
    assert_final(whole, 10)
    parts = list(client.generate(model=name, prompt="Tell me a story.", system="Be brief.",
                                 options=options, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model=name, prompt="Once upon a time", raw=True, options=options)
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no template, no system prompt
    loaded = client.generate(model=name, keep_alive="5m")  # an empty prompt: the "load" call
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert client.chat(model=name, messages=[]).done_reason == "load"


def test_logprobs_whole_and_streamed(client, name):
    """Ollama's `logprobs`/`top_logprobs` (its client's fields): one entry per generated
    token, a line of a stream carrying its own tokens'."""
    options = {"temperature": 0, "num_predict": 8}
    whole = client.generate(model=name, prompt="Tell me a story.", logprobs=True, top_logprobs=3,
                            options=options)
    assert len(whole.logprobs) == whole.eval_count
    assert "".join(entry.token for entry in whole.logprobs) == whole.response
    for entry in whole.logprobs:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the likeliest
    for stream in (True, False):
        reply = client.chat(model=name, messages=USER, logprobs=True, options=options, stream=stream)
        parts = list(reply) if stream else [reply]
        entries = [entry for part in parts for entry in part.logprobs or []]
        assert len(entries) == parts[-1].eval_count and all(e.top_logprobs == [] for e in entries)
        assert "".join(e.token for e in entries) == "".join(p.message.content for p in parts)
    assert client.generate(model=name, prompt="hi", options=options).logprobs is None  # not asked


def test_format_json_and_schema(client, name, server):
    reply = client.chat(model=name, messages=USER, format="json",
                        options={"temperature": 0, "num_predict": 160})
    assert isinstance(json.loads(reply.message.content), dict)
    for stream in (False, True):
        result = client.generate(model=name, prompt="A person as JSON", format=PERSON,
                                 options={"temperature": 0.7, "seed": 3, "num_predict": 120},
                                 stream=stream)
        text = result.response if not stream else "".join(p.response for p in result)
        jsonschema.validate(json.loads(text), PERSON)
    # With tools too (the generic format): a call, or an answer held to the schema.
    for seed in range(3):
        message = post(server, "/api/chat", {
            "model": name, "messages": USER, "tools": [WEATHER], "format": PERSON, "stream": False,
            "options": {"temperature": 1.0, "seed": seed, "num_predict": 160}}).json()["message"]
        if not message.get("tool_calls"):
            jsonschema.validate(json.loads(message["content"]), PERSON)


def first_call(chat, seeds=range(8)) -> tuple[int, dict]:
    """The model chooses whether to call (the demo template renders no tools: the generic
    format), so a few seeds are tried; under the grammar the reply is valid either way."""
    for seed in seeds:
        message = chat(seed)
        if message.get("tool_calls"):
            return seed, message
        assert isinstance(message["content"], str)
    raise AssertionError("no seed made a call")


def test_tool_calls_in_ollama_shape(client, name, server):
    def raw_chat(seed: int) -> dict:
        reply = post(server, "/api/chat", {"model": name, "messages": USER, "tools": [WEATHER],
                                           "stream": False, "options": {
                                               "temperature": 1.0, "seed": seed, "num_predict": 120}})
        assert reply.status_code == 200 and reply.json()["done"]
        return reply.json()["message"]

    seed, message = first_call(raw_chat)
    message_calls = message["tool_calls"]
    for call in message["tool_calls"]:  # Ollama's shape: the arguments are an object
        assert call["function"]["name"] == "get_weather" and set(call) == {"function"}
        jsonschema.validate(call["function"]["arguments"], WEATHER["function"]["parameters"])
    # The call and its result go back in the history, as Ollama's clients send them.
    history = USER + [{"role": "assistant", "content": "", "tool_calls": message["tool_calls"]},
                      {"role": "tool", "content": "21 degrees", "tool_name": "get_weather"}]
    assert client.chat(model=name, messages=history, options={"num_predict": 4}).done
    # The official client keeps only a schema's type, properties and required (it drops
    # maxLength): its calls parse into its own types.
    _, message = first_call(lambda seed: client.chat(
        model=name, messages=USER, tools=[WEATHER],
        options={"temperature": 1.0, "seed": seed, "num_predict": 120}).message.model_dump())
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert isinstance(message["tool_calls"][0]["function"]["arguments"]["city"], str)
    # Streamed (NDJSON): each call arrives whole in one object; they add up to the reply's.
    body = {"model": name, "messages": USER, "tools": [WEATHER],
            "options": {"temperature": 1.0, "seed": seed, "num_predict": 120}}
    with httpx.stream("POST", f"{server.base_url}/api/chat", json=body, headers=server.headers,
                      timeout=120) as streamed:
        assert streamed.headers["content-type"] == "application/x-ndjson"
        parts = [json.loads(line) for line in streamed.iter_lines() if line]
    assert [p["done"] for p in parts] == [False] * (len(parts) - 1) + [True]
    assert [c for p in parts for c in p["message"].get("tool_calls", [])] == message_calls


def test_model_listings(client, name, server):
    (listed,) = client.list().models
    assert listed.model == f"{name}:latest" and len(listed.digest) == 64 and listed.size > 0
    assert listed.details.format == "safetensors" and listed.details.family
    assert listed.details.parameter_size and listed.details.quantization_level
    (running,) = client.ps().models
    assert running.model == listed.model and running.size >= listed.size and running.context_length > 0
    shown = client.show(f"{name}:latest")
    assert shown.details.family == listed.details.family and shown.template
    assert shown.modelinfo["general.parameter_count"] > 0 and "tools" in shown.capabilities
    assert "thinking" not in shown.capabilities  # no --reasoning-parser: think true is a 400
    version = httpx.get(f"{server.base_url}/api/version", headers=server.headers).json()["version"]
    assert version.count(".") == 2
    root = httpx.get(f"{server.base_url}/")  # open: Ollama's probe
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert httpx.head(f"{server.base_url}/").status_code == 200


def test_curl_style_body_without_json_content_type(server, name):
    body = json.dumps({"model": name, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    reply = httpx.post(f"{server.base_url}/api/generate", content=body, timeout=60,
                       headers={**server.headers, "Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status_code == 200 and reply.json()["done"]


@pytest.mark.parametrize(("body", "status", "quoted"), [
    ({"model": "llama3.2"}, 404, "served name"),  # the error names the model served
    ({}, 400, "model"),
    ({"model": "NAME", "options": {"temprature": 0.5}}, 400, "options.temprature"),
    ({"model": "NAME", "options": {"top_p": 5}}, 400, "options.top_p"),
    ({"model": "NAME", "options": {"num_predict": 0}}, 400, "options.num_predict"),
    ({"model": "NAME", "options": {"mirostat": 2}}, 400, "options.mirostat"),
    ({"model": "NAME", "format": "xml"}, 400, "format"),
    ({"model": "NAME", "images": ["aGk="]}, 400, "images"),
    ({"model": "NAME", "think": True}, 400, "think"),
    ({"model": "NAME", "suffix": "end"}, 400, "suffix"),
    ({"model": "NAME", "top_logprobs": 3}, 400, "top_logprobs needs logprobs"),
    ({"model": "NAME", "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
])
def test_generate_errors_in_ollama_shape(server, name, body, status, quoted):
    body = {"prompt": "hello", **body, "stream": False}
    if body.get("model") == "NAME":
        body["model"] = name
    reply = post(server, "/api/generate", body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error, str)
    assert (name if quoted == "served name" else quoted) in error


def test_chat_errors(server, client, name):
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="nope:7b", messages=USER)
    assert caught.value.status_code == 404 and name in caught.value.error
    images = [{**USER[0], "images": ["aGk="]}]
    reply = post(server, "/api/chat", {"model": name, "messages": images})
    assert reply.status_code == 400 and "images" in reply.json()["error"]
    unauthorized = httpx.get(f"{server.base_url}/api/tags")
    assert unauthorized.status_code == 401 and "API key" in unauthorized.json()["error"]
    malformed = httpx.post(f"{server.base_url}/api/chat", content=b"{", headers=server.headers)
    assert malformed.status_code == 400 and "JSON" in malformed.json()["error"]
    huge = post(server, "/api/chat", {"model": name, "messages": [{"role": "user",
                                                                   "content": "x" * (5 << 20)}]})
    assert huge.status_code == 413 and "--max-request-body-mb" in huge.json()["error"]


def test_model_management_answers_as_a_one_model_server(server, client, name):
    # Apps pull their model before using it: the served one (or an adapter) is here already.
    assert client.pull(f"{name}:latest").status == "success"
    assert [p.status for p in client.pull(name, stream=True)] == ["success"]
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("llama3.2")
    assert caught.value.status_code == 404
    assert name in caught.value.error and "kvdeck pull" in caught.value.error
    for call in (lambda: client.create(model="mine", from_=name, system="Be brief."),
                 lambda: client.copy(name, "copy"), lambda: client.delete(name),
                 lambda: client.push(name)):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 501 and "kvdeck rm" in caught.value.error
    blob = httpx.head(f"{server.base_url}/api/blobs/sha256:{'0' * 64}", headers=server.headers)
    assert blob.status_code == 501
    assert httpx.post(f"{server.base_url}/api/pull", json={"model": name}).status_code == 401
    assert client.list().models[0].model == f"{name}:latest"  # nothing changed


def test_disconnect_mid_stream_aborts(server, name):
    """Hanging up cancels the engine request; the metrics count Ollama's requests too. A
    schema of one long string keeps the model talking (no end of text before 300 chars)."""
    before = wait_idle(server)
    body = {"model": name, "prompt": "Talk.", "format": {"type": "string", "minLength": 300},
            "options": {"num_predict": 400}}
    with httpx.stream("POST", f"{server.base_url}/api/generate", json=body,
                      headers=server.headers, timeout=60) as streamed:
        lines = streamed.iter_lines()  # kept referenced: dropping it closes the stream
        for _ in range(3):
            assert json.loads(next(lines))["done"] is False
    after = wait_idle(server)
    key = "vllm:request_success_total{finished_reason=abort}"
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert after["vllm:num_requests_running{}"] == 0 and after["vllm:kv_cache_usage_perc{}"] == 0
    generated = after["vllm:generation_tokens_total{}"] - before["vllm:generation_tokens_total{}"]
    assert 3 <= generated < 400
