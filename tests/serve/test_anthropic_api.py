"""Anthropic's Messages API (/v1/messages) through the official `anthropic` client against a
live server: the demo model with a chat template that renders tools (test_structured_api's).
A request is the chat request it translates to, so greedy replies are compared with the chat
route's token for token; streams are checked against Anthropic's event order and the
client's own accumulator."""

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.serve.conftest import start_server, stop_server
from tests.serve.tool_servers import demo_with_tools_template, typed_events

pytestmark = pytest.mark.timeout(300)

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
AS_CHAT_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER["input_schema"]}}
QUESTION = "What is the weather in Paris?"
GREEDY = {"extra_body": {"temperature": 0}}  # the client (2.x) takes no temperature of its own


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = demo_with_tools_template(tmp_path_factory.mktemp("anthropic_model"))
    live = start_server(model, tmp_path_factory.mktemp("anthropic_logs"), "--served-model-name", "demo")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def api(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(api, messages, max_tokens=24, **extra):
    return api.chat.completions.create(model="demo", messages=messages, temperature=0,
                                       max_tokens=max_tokens, **extra)


def ask(server, **body) -> httpx.Response:
    """A raw request (the client's own types stop some values before they are sent)."""
    return httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
        "model": "demo", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": QUESTION}], **body})


def sse_events(server, **body) -> list[dict]:
    return typed_events(f"{server.base_url}/v1/messages",
                        {"model": "demo", "stream": True, "temperature": 0, **body})


def test_a_reply_is_the_chat_routes_reply(server, api):
    for max_tokens in (24, 2):  # the second ends on max_tokens
        reply = ask(server, system=[{"type": "text", "text": "Be brief."}], max_tokens=max_tokens,
                    messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]).json()
        same = chat(api, [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": QUESTION}], max_tokens)
        assert reply["type"] == "message" and reply["id"].startswith("msg_")
        assert reply["model"] == "demo" and reply["role"] == "assistant"
        assert reply["content"] == [{"type": "text", "text": same.choices[0].message.content}]
        used = reply["usage"]
        assert used["input_tokens"] + used["cache_read_input_tokens"] == same.usage.prompt_tokens
        assert used["output_tokens"] == same.usage.completion_tokens
        length = same.choices[0].finish_reason == "length"
        assert reply["stop_reason"] == ("max_tokens" if length else "end_turn")


def test_a_stop_sequence_is_named(server):
    text = ask(server).json()["content"][0]["text"]
    stop = text[3:6]
    reply = ask(server, stop_sequences=["never", stop]).json()
    assert reply["stop_reason"] == "stop_sequence" and reply["stop_sequence"] == stop
    assert reply["content"][0]["text"] == text[:text.index(stop)]


def test_a_history_with_tool_use_and_its_result_is_the_chat_history(server, api):
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
            "input": {"city": "Paris", "unit": "c"}}
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm",
                                                  "signature": "x"}, call]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": "21 degrees"}]},
                                            {"type": "text", "text": "And tomorrow?"}]}]
    reply = ask(server, messages=history, tools=[WEATHER], tool_choice={"type": "none"}).json()
    same = chat(api, [{"role": "user", "content": QUESTION},
                      {"role": "assistant", "content": None, "tool_calls": [{
                          "id": "toolu_1", "type": "function", "function": {
                              "name": "get_weather", "arguments": json.dumps(call["input"])}}]},
                      {"role": "tool", "tool_call_id": "toolu_1", "content": "21 degrees"},
                      {"role": "user", "content": "And tomorrow?"}],
                tools=[AS_CHAT_TOOL], tool_choice="none")
    assert reply["usage"]["input_tokens"] + reply["usage"]["cache_read_input_tokens"] == \
        same.usage.prompt_tokens
    assert reply["content"][0]["text"] == same.choices[0].message.content


def test_a_forced_call_is_a_tool_use_block_whole_and_streamed(claude, server):
    request = {"model": "demo", "max_tokens": 200, "tools": [WEATHER], **GREEDY,
               "messages": [{"role": "user", "content": QUESTION}],
               "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    reply = claude.messages.create(**request)
    assert reply.stop_reason == "tool_use"
    (use,) = reply.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    with claude.messages.stream(**request) as stream:  # the client's own accumulator
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", use.name, use.input)]
    assert final.stop_reason == "tool_use"
    events = sse_events(server, **{k: v for k, v in request.items() if k != "extra_body"})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[1]["content_block"]["type"] == "tool_use"
    sent = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta")
    assert json.loads(sent) == use.input
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["output_tokens"] == reply.usage.output_tokens


def test_a_streamed_text_adds_up_to_the_whole_reply(claude, server):
    whole = ask(server).json()
    with claude.messages.stream(model="demo", max_tokens=24, **GREEDY,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole["content"][0]["text"] == final.content[0].text
    assert final.stop_reason == whole["stop_reason"] and final.usage.output_tokens == \
        whole["usage"]["output_tokens"]
    events = sse_events(server, max_tokens=24, messages=[{"role": "user", "content": QUESTION}])
    assert events[0]["message"]["usage"]["input_tokens"] == \
        whole["usage"]["input_tokens"] + whole["usage"]["cache_read_input_tokens"]
    assert [e["index"] for e in events if "index" in e] == [0] * (len(events) - 3)


def test_server_tools_are_left_out(server):
    """Anthropic runs web search itself; kvdeck cannot, so the model is not offered it."""
    plain = ask(server).json()
    searching = ask(server, tools=[{"type": "web_search_20250305", "name": "web_search"}]).json()
    assert searching["content"] == plain["content"]

    def prompt(reply: dict) -> int:
        return reply["usage"]["input_tokens"] + reply["usage"]["cache_read_input_tokens"]

    assert prompt(searching) == prompt(plain)


def test_mid_conversation_system_messages_as_claude_code_sends_them(server, api):
    history = [{"role": "user", "content": QUESTION},
               {"role": "system", "content": "Answer in French."}]
    reply = ask(server, messages=history).json()
    same = chat(api, [{"role": "user", "content": QUESTION},
                      {"role": "system", "content": "Answer in French."}])
    assert reply["content"][0]["text"] == same.choices[0].message.content


def test_count_tokens_is_what_the_request_renders(claude, api):
    history = [{"role": "user", "content": QUESTION}]
    counted = claude.messages.count_tokens(model="demo", messages=history, tools=[WEATHER],
                                           system="Be brief.")
    same = chat(api, [{"role": "system", "content": "Be brief."}, *history], 1, tools=[AS_CHAT_TOOL])
    assert counted.input_tokens == same.usage.prompt_tokens


def test_output_format_holds_the_reply_to_a_schema(server):
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = ask(server, max_tokens=100, output_format={"type": "json_schema", "schema": person}).json()
    assert reply["stop_reason"] == "end_turn"
    jsonschema.validate(json.loads(reply["content"][0]["text"]), person)


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"max_tokens": None}, 400, "max_tokens: Input should be a valid integer"),
    ({"temperature": 1.5}, 400, "temperature: Input should be less than or equal to 1"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "content blocks of type 'image' are not supported"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, 400,
     "tools of type 'bash_20250124' are not supported"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, 400, "needs the tool's name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, 400,
     "'nope', which is not in tools"),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "max_model_len"),
    ({"model": "claude-sonnet-4-5"}, 404, "does not exist; this server serves 'demo'"),
])
def test_what_cannot_work_says_so_in_anthropics_shape(server, body, status, says):
    response = ask(server, **body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert says in error["error"]["message"], error
    assert ask(server, max_tokens=2).status_code == 200  # and the server goes on
