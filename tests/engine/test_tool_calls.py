"""Tool-call formats per family: golden texts (complete, several calls, malformed, plain
text), the streamed view growing into the whole one, detection from chat templates, and
the forcing grammar accepting exactly calls in the format."""

import json

import pytest

from kvdeck.engine.frontend.tool_calls import FORMATS, detect_format, parse
from kvdeck.engine.grammar.compile import check_grammar
from kvdeck.engine.types.structured import StructuredOutputsParams

HERMES, LLAMA, MISTRAL = FORMATS["hermes"], FORMATS["llama3_json"], FORMATS["mistral"]

GOLDEN = [
    # (format, text, expected content, expected [(name, arguments)])
    (HERMES, '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', "", [("f", '{"x": 1}')]),
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"s": "a}b"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
     "Let me look.\n", [("f", '{"s": "a}b"}'), ("g", "{}")]),
    (HERMES, "<tool_call>\nnot json at all\n</tool_call>", "<tool_call>\nnot json at all\n</tool_call>", []),
    (HERMES, "Just an answer, no tools.", "Just an answer, no tools.", []),
    (HERMES, '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>',
     '<tool_call>\n{"arguments": {"x": 1}}\n</tool_call>', []),
    (LLAMA, '{"name": "f", "parameters": {"a": [1, {"b": "]"}]}}', "", [("f", '{"a": [1, {"b": "]"}]}')]),
    (LLAMA, '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"q": "x"}}',
     "", [("f", "{}"), ("g", '{"q": "x"}')]),
    (LLAMA, "The answer is 42.", "The answer is 42.", []),
    (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"x": "y"}}, {"name": "g", "arguments": {}}]',
     "", [("f", '{"x": "y"}'), ("g", "{}")]),
    (MISTRAL, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", []),
    (MISTRAL, "No calls here.", "No calls here.", []),
]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), GOLDEN)
def test_golden_texts(fmt, text, content, calls):
    parsed = parse(fmt, text, final=True)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls if c.complete] == calls


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [g for g in GOLDEN if g[3]])
def test_streaming_view_grows_into_the_whole(fmt, text, content, calls):
    """At every prefix: content only grows, a call's name appears whole, its arguments only
    grow, and nothing of a call ever shows as content."""
    last_content, last_args = "", {}
    for cut in range(1, len(text) + 1):
        parsed = parse(fmt, text[:cut], final=False)
        assert parsed.content.startswith(last_content)
        assert content.startswith(parsed.content)
        last_content = parsed.content
        for index, call in enumerate(parsed.calls):
            if call.name is not None:
                assert call.name == calls[index][0]
            assert call.arguments.startswith(last_args.get(index, ""))
            assert calls[index][1].startswith(call.arguments)
            last_args[index] = call.arguments


def test_detection_from_templates():
    assert detect_format("{% for tool in tools %}<tool_call>{% endfor %}") is HERMES
    assert detect_format("{{- '[TOOL_CALLS]' }}") is MISTRAL
    assert detect_format("<|start_header_id|>ipython<|end_header_id|>") is LLAMA
    assert detect_format("{{ messages }}") is None and detect_format(None) is None


@pytest.mark.parametrize("fmt", [HERMES, LLAMA, MISTRAL])
def test_forcing_grammars_are_valid(fmt):
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
             {"name": "g"}]
    for parallel in (True, False):
        check_grammar(StructuredOutputsParams(grammar=fmt.grammar(tools, parallel)))
    schema = fmt.call_schema(tools)
    assert {option["properties"]["name"]["const"] for option in schema["anyOf"]} == {"f", "g"}
    assert json.loads(json.dumps(schema))  # serialisable, as the grammar embeds it


# zod writes `propertyNames` for a record; llguidance does not implement it.
RECORD_TOOL = {"name": "TaskCreate", "parameters": {"type": "object", "properties": {
    "metadata": {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}},
    "subject": {"type": "string"}}, "required": ["subject"]}}


def test_a_tool_schema_with_an_unimplemented_keyword_still_holds_its_calls():
    from kvdeck.engine.frontend.generic_tools import GenericTools

    grammars = [fmt.grammar([RECORD_TOOL], parallel) for fmt in (HERMES, LLAMA, MISTRAL)
                for parallel in (True, False)]
    grammars.append(GenericTools([RECORD_TOOL], may_answer=True, parallel=True).grammar())
    for grammar in grammars:  # the keyword is left unenforced, the rest holds
        check_grammar(StructuredOutputsParams(grammar=grammar))
    # A schema the user gave as the answer's shape is still held to every keyword, and the
    # error quotes a long schema's line cut short.
    big = {**RECORD_TOOL["parameters"], "description": "x" * 20000}
    with pytest.raises(ValueError, match="propertyNames") as refused:
        check_grammar(StructuredOutputsParams(json=big))
    assert len(str(refused.value)) < 1000
