"""Object schemas closed as vLLM's default backend and llama.cpp close them: an object that
names its properties and says nothing of others admits no other keys, in structured outputs
and in tool-call arguments; a schema that asks for extra keys, and the parts of an `allOf`,
keep what they mean. Properties come in the order the schema lists them."""

import json

import llguidance
import llguidance.hf
import pytest
from transformers import AutoTokenizer

from kvdeck import LLM, SamplingParams
from kvdeck.assets import demo_model_dir
from kvdeck.engine.frontend.generic_tools import GenericTools
from kvdeck.engine.frontend.tool_calls import FORMATS
from kvdeck.engine.grammar.closed_schema import closed_objects
from kvdeck.engine.grammar.compile import grammar_definition
from kvdeck.engine.types.structured import StructuredOutputsParams as Spec

THOUGHT = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                            "answer": {"type": "integer"}},
           "required": ["reasoning", "answer"]}
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x"]}


def test_an_object_naming_its_properties_is_closed_and_the_input_is_not_changed():
    schema = json.loads(json.dumps(POINT))
    assert closed_objects(schema) == {**POINT, "additionalProperties": False}
    assert schema == POINT


P = POINT
NULL = {"type": "null"}


@pytest.mark.parametrize(("schema", "path"), [
    ({"type": "object", "properties": {"p": P}}, ["properties", "p"]),
    ({"type": "array", "items": P}, ["items"]),
    ({"type": "array", "prefixItems": [NULL, P]}, ["prefixItems", 1]),
    ({"anyOf": [NULL, P]}, ["anyOf", 1]),
    ({"oneOf": [P, NULL]}, ["oneOf", 0]),
    ({"$defs": {"Point": P}, "$ref": "#/$defs/Point"}, ["$defs", "Point"]),
    ({"definitions": {"Point": P}}, ["definitions", "Point"]),
    ({"type": "object", "additionalProperties": P}, ["additionalProperties"]),
    ({"type": "object", "patternProperties": {"^p": P}}, ["patternProperties", "^p"]),
    ({"if": NULL, "then": P}, ["then"]),
    ({"type": "array", "contains": P}, ["contains"]),
    ({"dependentSchemas": {"x": P}}, ["dependentSchemas", "x"]),
])
def test_nested_objects_are_closed_wherever_a_schema_may_sit(schema, path):
    node = closed_objects(schema)
    for key in path:
        node = node[key]
    assert node["additionalProperties"] is False


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {"type": "object", "properties": {"a": {"type": "string"}},
     "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"a": {"type": "string"}}, "unevaluatedProperties": True},
    {"type": "object"},  # any object: nothing named, nothing closed
    {"type": "object", "properties": {"a": {"type": "string"}}, "$ref": "#/$defs/B",
     "$defs": {"B": {"type": "object"}}},
])
def test_a_schema_that_says_what_other_keys_may_be_is_left_as_it_is(schema):
    assert closed_objects(schema) == schema


@pytest.mark.parametrize("schema", [
    # Parts applied to the same object as their holder, which names keys of its own.
    {"type": "object", "properties": {"kind": {"type": "string"}},
     "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
    {"type": "object", "properties": {"kind": {"type": "string"}},
     "if": {"properties": {"kind": {"const": "x"}}}, "then": {"properties": {"x": {}}}},
    {"not": {"type": "object", "properties": {"a": {}}}},
    {"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["a"]}},
])
def test_parts_that_meet_other_keys_stay_open(schema):
    assert closed_objects(schema) == schema


def test_the_parts_of_an_allof_stay_open_and_their_children_close():
    schema = {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"b": POINT}, "required": ["b"]}]}
    closed = closed_objects(schema)
    assert [("additionalProperties" in part) for part in closed["allOf"]] == [False, False]
    assert closed["allOf"][1]["properties"]["b"]["additionalProperties"] is False


def test_a_required_key_the_object_does_not_list_stays_possible():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    closed = closed_objects(schema)
    assert closed["properties"] == {"a": {"type": "integer"}, "b": {}}
    assert closed["additionalProperties"] is False


def test_a_property_named_properties_is_a_property():
    schema = {"type": "object", "properties": {"properties": {"type": "string"}}}
    closed = closed_objects(schema)
    assert closed["properties"] == {"properties": {"type": "string"}}
    assert closed["additionalProperties"] is False


@pytest.fixture(scope="module")
def tokenizer():
    hf = AutoTokenizer.from_pretrained(demo_model_dir())
    return llguidance.hf.from_tokenizer(hf)


def admits(tokenizer, schema: dict, text: str) -> bool:
    """Whether the engine's grammar for `schema` admits `text` whole."""
    matcher = llguidance.LLMatcher(tokenizer, grammar_definition(Spec(json=schema)), log_level=0)
    tokens = tokenizer.tokenize_str(text)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) \
        and matcher.is_accepting()


@pytest.mark.parametrize(("schema", "text", "admitted"), [
    (POINT, '{"x": 1, "y": 2}', True),
    (POINT, '{"x": 1, "z": 2}', False),
    ({**POINT, "additionalProperties": True}, '{"x": 1, "z": 2}', True),
    ({"type": "array", "items": POINT}, '[{"x": 1}, {"x": 2, "name": "p"}]', False),
    ({"$defs": {"P": POINT}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}},
     '{"p": {"x": 1, "w": 0}}', False),
    ({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     '{"a": 1, "b": 2}', True),
    ({"type": "object"}, '{"anything": [1, 2]}', True),
    # Properties come in the schema's order (reasoning before its answer), not sorted.
    (THOUGHT, '{"reasoning": "r", "answer": 1}', True),
    (THOUGHT, '{"answer": 1, "reasoning": "r"}', False),
    ({"anyOf": [POINT, {"type": "object", "properties": {"r": {"type": "integer"}}}]},
     '{"r": 1, "x": 2}', False),
    ({"type": "object", "properties": {"kind": {"type": "string"}},
      "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]},
     '{"kind": "k", "a": 1}', True),
    ({**POINT, "required": ["x", "label"]}, '{"x": 1, "label": [true]}', True),
    ({**POINT, "required": ["x", "label"]}, '{"x": 1, "label": 2, "z": 0}', False),
])
def test_the_engines_grammar_admits_only_the_keys_the_schema_allows(tokenizer, schema, text, admitted):
    assert admits(tokenizer, schema, text) is admitted


def test_tool_arguments_are_closed_in_every_format():
    tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}]
    for fmt in FORMATS.values():
        arguments = fmt.call_schema(tools)["properties"][fmt.args_key]
        assert arguments["additionalProperties"] is False
    reply = GenericTools(tools, may_answer=False).reply_schema()
    call = reply["properties"]["tool_calls"]["items"]
    assert call["properties"]["arguments"]["additionalProperties"] is False


def test_a_model_writes_no_key_the_schema_does_not_name():
    """The demo model, sampling freely, invents keys when a grammar lets it (it did here,
    before objects were closed); held to the schema's own keys, every object has only them."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "maximum": 99}}}
    with LLM(kv_cache_memory_gib=0.02) as llm:
        params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=96,
                                 structured_outputs=Spec(json=schema)) for seed in range(8)]
        outputs = llm.generate([f"A person ({seed}):" for seed in range(8)], params)
    for out in outputs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        assert set(json.loads(completion.text)) <= {"name", "age"}, completion.text
