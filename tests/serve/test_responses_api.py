"""OpenAI's Responses API (/v1/responses) through the official `openai` client against a live
server: the demo model with a chat template that renders tools (test_structured_api's). A
request is the chat request it translates to, so greedy replies are compared with the chat
route's token for token; streams are checked against OpenAI's event order and reassembled."""

import json

import httpx
import jsonschema
import openai
import pytest

from tests.serve.conftest import start_server, stop_server
from tests.serve.tool_servers import demo_with_tools_template, typed_events

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
AS_CHAT_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
QUESTION = "What is the weather in Paris?"
GREEDY = {"temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = demo_with_tools_template(tmp_path_factory.mktemp("responses_model"))
    live = start_server(model, tmp_path_factory.mktemp("responses_logs"), "--served-model-name", "demo")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(api, messages, max_tokens=24, **extra):
    return api.chat.completions.create(model="demo", messages=messages, temperature=0,
                                       max_tokens=max_tokens, **extra)


def sse_events(server, **body) -> list[dict]:
    return typed_events(f"{server.base_url}/v1/responses", {"model": "demo", "stream": True, **body})


def test_a_reply_is_the_chat_routes_reply(api):
    for max_tokens in (24, 2):  # the second ends on max_output_tokens: incomplete
        reply = api.responses.create(model="demo", input=QUESTION, instructions="Be brief.",
                                     temperature=0, max_output_tokens=max_tokens)
        same = chat(api, [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": QUESTION}], max_tokens)
        assert reply.object == "response" and reply.id.startswith("resp_")
        assert reply.output_text == same.choices[0].message.content
        assert reply.usage.input_tokens == same.usage.prompt_tokens
        assert reply.usage.output_tokens == same.usage.completion_tokens
        length = same.choices[0].finish_reason == "length"
        assert reply.status == ("incomplete" if length else "completed")
        assert (reply.incomplete_details is not None) == length
        assert reply.output[0].type == "message" and reply.output[0].status == reply.status
        assert reply.instructions == "Be brief." and reply.max_output_tokens == max_tokens


def test_a_history_with_a_call_and_its_output_is_the_chat_history(api):
    call_id = "call_abc"
    items = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
             {"type": "function_call", "call_id": call_id, "name": "get_weather",
              "arguments": '{"city": "Paris", "unit": "c"}'},
             {"type": "function_call_output", "call_id": call_id, "output": "21 degrees"},
             {"type": "reasoning", "id": "rs_1", "summary": []},  # taken, not rendered
             {"role": "assistant", "content": [{"type": "output_text", "text": "It is 21."}]},
             {"role": "user", "content": "And tomorrow?"}]
    reply = api.responses.create(model="demo", input=items, tools=[WEATHER], tool_choice="none",
                                 **GREEDY)
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": call_id, "type": "function", "function": {
                        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "21 degrees"},
                {"role": "assistant", "content": "It is 21."},
                {"role": "user", "content": "And tomorrow?"}]
    same = chat(api, messages, tools=[AS_CHAT_TOOL], tool_choice="none")
    assert reply.usage.input_tokens == same.usage.prompt_tokens
    assert reply.output_text == same.choices[0].message.content


def test_a_required_call_is_a_function_call_item_whole_and_streamed(api, server):
    request = {"input": QUESTION, "tools": [WEATHER], "tool_choice": "required",
               "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 200}
    reply = api.responses.create(model="demo", **request)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert reply.status == "completed" and len(calls) == 1
    for call in calls:
        assert call.name == "get_weather" and call.call_id.startswith("call_")
        assert call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    events = sse_events(server, **request)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    streamed = [item for item in final["output"] if item["type"] == "function_call"]
    assert [c["arguments"] for c in streamed] == [c.arguments for c in calls]
    for call in streamed:
        index = final["output"].index(call)
        deltas = "".join(e["delta"] for e in events if e["type"] ==
                         "response.function_call_arguments.delta" and e["output_index"] == index)
        done = [e for e in events if e["type"] == "response.function_call_arguments.done"
                and e["output_index"] == index]
        assert deltas == done[0]["arguments"] == call["arguments"]
    # the client's own accumulator takes the stream as OpenAI's
    with api.responses.stream(model="demo", **request) as stream:
        final_response = stream.get_final_response()
    assert [c.arguments for c in final_response.output if c.type == "function_call"] == \
        [c.arguments for c in calls]


def test_codexs_tools_namespaces_flattened_and_hosted_tools_left_out(api, server):
    """Codex groups some functions in a namespace tool and sends web_search with every turn."""
    function = {k: v for k, v in WEATHER.items()}
    tools = [{"type": "namespace", "name": "weather_v1", "description": "Weather tools",
              "tools": [function]}, {"type": "web_search", "external_web_access": False}]
    request = {"input": QUESTION, "tools": tools, "tool_choice": "required",
               "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 200}
    reply = api.responses.create(model="demo", **request)
    (call,) = [item for item in reply.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.namespace == "weather_v1"
    assert [tool.model_dump(exclude_none=True) for tool in reply.tools] == \
        [{**function, "namespace": "weather_v1"}]  # what the model was offered
    events = sse_events(server, **request)
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[0]["namespace"] == "weather_v1"
    assert events[-1]["response"]["output"][0]["namespace"] == "weather_v1"
    assert events[-1]["response"]["output"][0]["arguments"] == call.arguments


def test_a_stream_follows_openais_event_order_and_adds_up(api, server):
    whole = api.responses.create(model="demo", input=QUESTION, **GREEDY)
    events = sse_events(server, input=QUESTION, **GREEDY)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole.output_text == events[-4]["text"]
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
    assert events[0]["response"]["id"] == final["id"] and events[0]["response"]["status"] == "in_progress"


def test_logprobs_when_included(api, server):
    body = {"input": QUESTION, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            **GREEDY}
    reply = api.responses.create(model="demo", **body)
    logprobs = reply.output[0].content[0].logprobs
    same = chat(api, [{"role": "user", "content": QUESTION}], logprobs=True, top_logprobs=2)
    assert [lp.token for lp in logprobs] == [lp.token for lp in same.choices[0].logprobs.content]
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)
    events = sse_events(server, **body)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    done = events[-4]
    assert done["type"] == "response.output_text.done"
    assert [lp["token"] for lp in done["logprobs"]] == [lp.token for lp in logprobs]
    # the deltas carry their text's; those of text never shown (the end token) only the done
    assert done["logprobs"][:len(streamed)] == streamed and len(streamed) >= len(logprobs) - 1
    assert "logprobs" not in api.responses.create(model="demo", input=QUESTION, **GREEDY) \
        .output[0].content[0].model_dump(exclude_none=True)


def test_text_format_holds_the_reply_to_a_schema(api):
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = api.responses.create(model="demo", input="A person, as JSON", temperature=0,
                                 max_output_tokens=100, text={"format": {
                                     "type": "json_schema", "name": "person", "schema": person}})
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), person)
    assert reply.text.format.type == "json_schema"


@pytest.mark.parametrize(("body", "status", "param", "says"), [
    ({"previous_response_id": "resp_1"}, 400, "previous_response_id",
     "no response 'resp_1' is kept"),
    ({"conversation": "conv_1"}, 400, "conversation", "keeps responses, not conversations"),
    ({"background": True}, 400, "background", "stream: true"),
    ({"truncation": "auto"}, 400, "truncation", "shorten the conversation"),
    ({"input": ""}, 400, "input", "must not be empty"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input", "'input_image' are not supported"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input", "'item_reference'"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input", "nothing to answer"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, 400, "tools",
     "'custom' are not supported"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, 400,
     "tool_choice", "'nope', which is not in tools"),
    ({"top_logprobs": 2}, 400, "top_logprobs", "message.output_text.logprobs"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format", "needs a schema"),
    ({"model": "gpt-4o"}, 404, "model", "does not exist"),
])
def test_what_cannot_work_says_so(server, body, status, param, says):
    response = httpx.post(f"{server.base_url}/v1/responses", timeout=60,
                          json={"input": QUESTION, "max_output_tokens": 4, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_an_input_over_the_context_names_input(server):
    response = httpx.post(f"{server.base_url}/v1/responses", timeout=60,
                          json={"input": "word " * 5000})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_a_conversation_continues_from_a_kept_response(api):
    first = api.responses.create(model="demo", input=QUESTION, instructions="Be brief.", **GREEDY)
    assert first.store is True
    second = api.responses.create(model="demo", input="And tomorrow?", previous_response_id=first.id,
                                  **GREEDY)
    assert second.previous_response_id == first.id
    # instructions are not carried over (OpenAI's rule); the turns are
    same = chat(api, [{"role": "user", "content": QUESTION},
                      {"role": "assistant", "content": first.output_text},
                      {"role": "user", "content": "And tomorrow?"}])
    assert second.usage.input_tokens == same.usage.prompt_tokens
    assert second.output_text == same.choices[0].message.content
    third = api.responses.create(model="demo", input="Thanks.", previous_response_id=second.id,
                                 max_output_tokens=2)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_a_call_is_answered_by_its_output_after_previous_response_id(api):
    called = api.responses.create(model="demo", input=QUESTION, tools=[WEATHER],
                                  tool_choice="required", parallel_tool_calls=False,
                                  temperature=0, max_output_tokens=200)
    (call,) = [item for item in called.output if item.type == "function_call"]
    answered = api.responses.create(
        model="demo", previous_response_id=called.id, tools=[WEATHER], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees"}],
        **GREEDY)
    same = chat(api, [{"role": "user", "content": QUESTION},
                      {"role": "assistant", "content": None, "tool_calls": [{
                          "id": call.call_id, "type": "function",
                          "function": {"name": call.name, "arguments": call.arguments}}]},
                      {"role": "tool", "tool_call_id": call.call_id, "content": "21 degrees"}],
                tools=[AS_CHAT_TOOL], tool_choice="none")
    assert answered.usage.input_tokens == same.usage.prompt_tokens
    assert answered.output_text == same.choices[0].message.content


def test_a_kept_response_is_fetched_listed_and_deleted(api, server):
    reply = api.responses.create(model="demo", input=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
        max_output_tokens=4)
    assert api.responses.retrieve(reply.id).model_dump() == reply.model_dump()
    items = api.responses.input_items.list(reply.id, order="asc").data
    assert [(item.role, item.content[0].text) for item in items] == \
        [("developer", "Be brief."), ("user", QUESTION)]
    streamed = sse_events(server, input=QUESTION, max_output_tokens=4)[-1]["response"]
    assert api.responses.retrieve(streamed["id"]).output[0].model_dump(exclude_none=True) == \
        streamed["output"][0]
    api.responses.delete(reply.id)
    for fetch in (lambda: api.responses.retrieve(reply.id), lambda: api.responses.delete(reply.id),
                  lambda: api.responses.input_items.list(reply.id)):
        with pytest.raises(openai.NotFoundError, match="is kept"):
            fetch()
    with pytest.raises(openai.BadRequestError, match="no response .* is kept"):
        api.responses.create(model="demo", input="hi", previous_response_id=reply.id)
    unkept = api.responses.create(model="demo", input=QUESTION, max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unkept.id)
