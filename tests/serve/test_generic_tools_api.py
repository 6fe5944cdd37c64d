"""Tool calls with models whose chat template renders no tools (the generic format), through
the official `openai` client against a live server: the demo model (served with
--tool-call-parser hermes, which such a template cannot use) and a tiny random llama. A
random model's reply under the grammar is valid by construction, so the checks are on
validity and shape, never on what it chose to say."""

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from kvdeck.engine.types.model_path import demo_model_dir
from tests.model_factory import build_tiny_model
from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(300)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 8}}, "required": ["zone"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters: arguments are {}
TOOLS = [WEATHER, TIME, PING]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"maxProperties": 0}) for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}
HISTORY = USER + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]


@pytest.fixture(scope="module", params=["demo", "tiny"])
def server(request, tmp_path_factory):
    if request.param == "demo":
        live = start_server(demo_model_dir(), tmp_path_factory.mktemp("generic_logs"),
                            "--served-model-name", "m", "--tool-call-parser", "hermes")
    else:  # its byte-level tokenizer spends a token on every character or two
        model = build_tiny_model(tmp_path_factory.mktemp("generic_model") / "llama", "llama",
                                 max_position_embeddings=2048)
        live = start_server(model, tmp_path_factory.mktemp("generic_logs"), "--served-model-name", "m")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(api, stream=False, **request):
    request = {"model": "m", "messages": USER, "tools": TOOLS, "max_tokens": 150, "temperature": 0,
               **request}
    return api.chat.completions.create(stream=stream, **request)


def assert_valid_calls(calls, names=tuple(SCHEMAS)):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_a_valid_call(api, parallel):
    choice = ask(api, tool_choice="required", parallel_tool_calls=parallel).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert_valid_calls(choice.message.tool_calls)
    assert parallel or len(choice.message.tool_calls) == 1


def test_named_calls_that_function(api):
    for seed in (1, 2):
        choice = ask(api, tool_choice=NAMED, temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        assert_valid_calls(choice.message.tool_calls, names=("get_time",))


class Address(BaseModel):
    street: str = Field(max_length=10)


class Move(BaseModel):
    to: Address


def test_a_pydantic_tool_with_nested_models_gets_valid_arguments(api):
    tool = openai.pydantic_function_tool(Move)  # its parameters refer to their own $defs
    assert "$defs" in tool["function"]["parameters"]
    choice = ask(api, tools=[tool], tool_choice="required", parallel_tool_calls=False,
                 max_tokens=None).choices[0]
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert Move.model_validate_json(call.function.arguments)


def test_auto_is_a_valid_call_or_a_plain_answer(api):
    for seed in range(4):
        choice = ask(api, tool_choice="auto", temperature=1.0, seed=seed).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert_valid_calls(choice.message.tool_calls)
        else:
            assert isinstance(choice.message.content, str)
            assert not choice.message.content.startswith('{"response"')  # the answer, unwrapped
            assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize(("tool_choice", "parallel", "max_tokens"), [
    ("required", True, None), (NAMED, True, None), ("auto", False, 150)])
def test_streamed_deltas_reassemble_to_the_whole_reply(api, tool_choice, parallel, max_tokens):
    """Budgets no call is cut by (a call cut by max_tokens was streamed, but is content in
    the whole reply): the room left, or one call (its strings are short)."""
    request = {"tool_choice": tool_choice, "temperature": 1.0, "seed": 7,
               "parallel_tool_calls": parallel, "max_tokens": max_tokens}
    whole = ask(api, **request).choices[0]
    content, names, arguments, finish = "", {}, {}, None
    for chunk in ask(api, stream=True, **request):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.index not in names:  # OpenAI's first delta of a call: id, type, name, ""
                assert call.id.startswith("call_") and call.type == "function"
                assert call.function.name and call.function.arguments == ""
                names[call.index] = call.function.name
            else:
                assert call.id is None and call.function.name is None
            arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason
    assert content == (whole.message.content or "")
    assert [(names[i], arguments[i]) for i in sorted(names)] == \
        [(call.function.name, call.function.arguments) for call in whole.message.tool_calls or []]


def test_none_shows_no_tools_and_holds_nothing(api):
    plain = ask(api, tools=None, max_tokens=8)
    none = ask(api, tool_choice="none", max_tokens=8)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens  # the tools are not in the prompt
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None


def test_a_tool_with_a_zod_record_is_called(api):
    """zod writes `propertyNames` for a record (Claude Code's TaskCreate has one); llguidance
    does not implement the keyword, which is left unenforced, not a refused request."""
    record = {"type": "function", "function": {"name": "task", "parameters": {
        "type": "object", "properties": {
            "subject": {"type": "string", "maxLength": 12},
            "metadata": {"type": "object", "propertyNames": {"type": "string"},
                         "additionalProperties": {"type": "integer"}, "maxProperties": 2}},
        "required": ["subject"], "additionalProperties": False}}}
    reply = ask(api, tools=[record], tool_choice="required", parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), record["function"]["parameters"])


def test_a_tool_result_in_the_history_renders_and_runs(api):
    before = ask(api, tools=None, max_tokens=4).usage.prompt_tokens
    for tools in (TOOLS, None):
        reply = ask(api, messages=HISTORY, tools=tools, max_tokens=40)
        assert reply.usage.prompt_tokens > before  # the call and its result are in the prompt
        if reply.choices[0].message.tool_calls:
            assert_valid_calls(reply.choices[0].message.tool_calls)
    # the next turn, after the model's answer, runs too
    answered = HISTORY + [{"role": "assistant", "content": "It is 21 degrees."},
                          {"role": "user", "content": "And the time?"}]
    reply = ask(api, messages=answered, tool_choice="required", max_tokens=None)  # the room left
    assert_valid_calls(reply.choices[0].message.tool_calls)


def test_auto_with_a_response_format_answers_in_its_schema(api):
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},
              "required": ["name"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
    request = {"response_format": fmt, "temperature": 1.0, "max_tokens": 100,
               "parallel_tool_calls": False}  # one call fits the demo model's 512 tokens
    for seed in range(3):
        for chunks in (False, True):
            if chunks:
                content, finish, called = "", None, False
                for chunk in ask(api, True, seed=seed, **request):
                    content += chunk.choices[0].delta.content or ""
                    called = called or bool(chunk.choices[0].delta.tool_calls)
                    finish = chunk.choices[0].finish_reason or finish
            else:
                choice = ask(api, seed=seed, **request).choices[0]
                content, finish = choice.message.content, choice.finish_reason
                called = bool(choice.message.tool_calls)
                if called:
                    assert_valid_calls(choice.message.tool_calls)
            if not called and finish == "stop":
                jsonschema.validate(json.loads(content), person)
            assert (finish == "tool_calls") == called


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "'nope', which is not in tools ('get_weather', 'get_time', 'ping')"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
    ({"tools": TOOLS, "guided_regex": "a+"}, "guided_regex", "generic format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
     "tools", "Invalid type: nonsense"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "only with tool_choice \"auto\""),
])
def test_what_cannot_work_is_a_400_saying_what_would(server, body, param, says):
    response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                          json={"messages": USER, "max_tokens": 8, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
