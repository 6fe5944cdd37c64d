"""The generic tool format (models whose chat template renders no tools): the reply schema
admits exactly the documented shapes, its grammar compiles, replies parse back whole and
as they stream, and past tool turns become plain text any template shows."""

import json

import jsonschema
import pytest

from kvdeck.engine.frontend.chat import prepare_messages
from kvdeck.engine.frontend.generic_tools import GenericTools, history_as_text
from kvdeck.engine.grammar.compile import check_grammar
from kvdeck.engine.types.structured import StructuredOutputsParams

WEATHER = {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}
NO_ARGS = {"name": "ping"}
CALLS = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\"ris"}}, ' \
        '{"name": "ping", "arguments": {}}]}'
ANSWER = '{"response": "caf\\u00e9 \\ud83d\\ude00 \\"quoted\\"\\n"}'


def valid(schema: dict, reply: str) -> bool:
    try:
        jsonschema.validate(json.loads(reply), schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize(("may_answer", "parallel"), [(True, True), (False, True), (False, False)])
def test_reply_schema_admits_the_documented_shapes(may_answer, parallel):
    tools = GenericTools([WEATHER, NO_ARGS], may_answer=may_answer, parallel=parallel)
    schema = tools.reply_schema()
    check_grammar(StructuredOutputsParams(grammar=tools.grammar()))
    one_call = '{"tool_calls": [{"name": "ping", "arguments": {}}]}'
    assert valid(schema, one_call)
    assert valid(schema, CALLS) == parallel
    assert valid(schema, ANSWER) == may_answer
    for wrong in ('{"tool_calls": []}', '{"tool_calls": [{"name": "nope", "arguments": {}}]}',
                  '{"tool_calls": [{"name": "get_weather", "arguments": {"town": "x"}}]}',
                  '{"tool_calls": [{"name": "ping", "arguments": {"x": 1}}]}', '{"answer": "x"}'):
        assert not valid(schema, wrong), wrong


def test_schemas_with_defs_keep_their_references():
    """Pydantic-made tools refer to `$defs` at their own top; nested in the reply they must
    still resolve (hoisted and renamed per function)."""
    address = {"type": "object", "properties": {"street": {"type": "string"}}, "required": ["street"],
               "additionalProperties": False}
    move = {"name": "move", "parameters": {
        "$defs": {"Address": address}, "type": "object", "required": ["to"],
        "properties": {"to": {"$ref": "#/$defs/Address"}}, "additionalProperties": False}}
    other = {"name": "other", "parameters": {
        "definitions": {"Address": {"type": "integer"}}, "type": "object", "required": ["n"],
        "properties": {"n": {"$ref": "#/definitions/Address"}}}}
    tools = GenericTools([move, other], answer_schema={"$defs": {"A": {"type": "boolean"}},
                                                        "$ref": "#/$defs/A"})
    schema = tools.reply_schema()
    check_grammar(StructuredOutputsParams(grammar=tools.grammar()))
    assert valid(schema, '{"tool_calls": [{"name": "move", "arguments": {"to": {"street": "x"}}}]}')
    assert not valid(schema, '{"tool_calls": [{"name": "move", "arguments": {"to": {"road": "x"}}}]}')
    assert valid(schema, '{"tool_calls": [{"name": "other", "arguments": {"n": 3}}]}')
    assert not valid(schema, '{"tool_calls": [{"name": "other", "arguments": {"n": "3"}}]}')
    assert valid(schema, '{"response": true}') and not valid(schema, '{"response": 1}')


def test_calls_parse_whole_and_grow_while_streaming():
    tools = GenericTools([WEATHER, NO_ARGS])
    whole = tools.parse(CALLS, final=True)
    assert whole.content == ""
    assert [(c.name, c.arguments, c.complete) for c in whole.calls] == [
        ("get_weather", '{"city": "Pa\\"ris"}', True), ("ping", "{}", True)]
    last_args: dict[int, str] = {}
    for cut in range(len(CALLS) + 1):
        parsed = tools.parse(CALLS[:cut], final=False)
        assert parsed.content == ""  # nothing of a call is ever content
        for index, call in enumerate(parsed.calls):
            if call.name is not None:
                assert call.name == whole.calls[index].name
            assert call.arguments.startswith(last_args.get(index, ""))
            assert whole.calls[index].arguments.startswith(call.arguments)
            last_args[index] = call.arguments


def test_a_plain_answer_streams_as_its_decoded_text():
    tools = GenericTools([WEATHER])
    answer = json.loads(ANSWER)["response"]
    assert tools.parse(ANSWER, final=True).content == answer
    shown = ""
    for cut in range(len(ANSWER) + 1):
        parsed = tools.parse(ANSWER[:cut], final=False)
        assert parsed.content.startswith(shown) and answer.startswith(parsed.content)
        assert not parsed.calls
        shown = parsed.content
    assert shown == answer


def test_an_answer_with_a_schema_is_its_json_text():
    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    tools = GenericTools([WEATHER], answer_schema=person)
    schema = tools.reply_schema()
    assert valid(schema, '{"response": {"name": "Ada"}}') and not valid(schema, ANSWER)
    assert json.dumps(person) in tools.system_prompt()
    reply = '{"response": {"name": "A}da"}}'
    shown = ""
    for cut in range(len(reply) + 1):
        parsed = tools.parse(reply[:cut], final=False)
        assert parsed.content.startswith(shown) and '{"name": "A}da"}'.startswith(parsed.content)
        shown = parsed.content
    assert tools.parse(reply, final=True).content == '{"name": "A}da"}'


def test_cut_short_or_foreign_text_is_content_as_written():
    tools = GenericTools([WEATHER])
    cut = '{"tool_calls": [{"name": "get_weather", "arguments": {"ci'
    assert tools.parse(cut, final=True).content == cut and not tools.parse(cut, final=True).calls
    assert tools.parse("hello", final=False).content == "hello"
    assert tools.parse('{"respo', final=False).pending
    assert tools.parse('{"response": ', final=False).pending
    assert tools.parse('{"response": 5}', final=True).content == '{"response": 5}'
    assert tools.parse('{"response": "half', final=True).content == "half"


def test_prompt_names_the_tools_and_joins_the_system_message():
    tools = GenericTools([WEATHER], may_answer=False, parallel=False)
    prompt = tools.system_prompt()
    assert json.dumps(WEATHER["parameters"]) in prompt and "must call get_weather" in prompt
    user = {"role": "user", "content": "hi"}
    added = tools.with_prompt([user])
    assert added == [{"role": "system", "content": prompt}, user]
    joined = tools.with_prompt([{"role": "system", "content": "Be brief."}, user])
    assert joined[0]["content"] == f"Be brief.\n\n{prompt}" and len(joined) == 2


HISTORY = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "25 C"},
]


def test_tool_turns_become_text_turns():
    converted = history_as_text(HISTORY)
    assert [m["role"] for m in converted] == ["user", "assistant", "user"]
    assert json.loads(converted[1]["content"]) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": "not json"}]}
    results = [json.loads(line) for line in converted[2]["content"].split("\n")]
    assert results == [
        {"tool_response": {"name": "get_weather", "tool_call_id": "c1", "content": "21 C"}},
        {"tool_response": {"name": "get_weather", "tool_call_id": "c2", "content": "25 C"}}]


def test_templates_without_tool_roles_get_text_turns_and_others_the_messages():
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert prepare_messages(HISTORY, plain) == history_as_text(HISTORY)
    native = plain + "{% if m['role'] == 'tool' %}{% endif %}"
    assert prepare_messages(HISTORY, native)[1]["tool_calls"] == HISTORY[1]["tool_calls"]
    bad = [HISTORY[0], {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}]
    with pytest.raises(ValueError, match="tool_calls must be"):
        prepare_messages(bad, plain)
