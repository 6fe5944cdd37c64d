"""Structured outputs in the engine: whatever the model would say, a constrained output
matches its schema, regex, choice or grammar; unconstrained requests batched beside them
are unchanged; grammars compile off the step loop and a bad one fails alone."""

import json
import re
import threading

import jsonschema
import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.grammar.compile import check_grammar
from kvdeck.engine.types.structured import StructuredOutputsParams as Spec

WORD = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": WORD, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer",
     "minimum": 1, "maximum": 999}, "tags": {"type": "array", "items": WORD, "maxItems": 2}},
     "required": ["id", "tags"], "additionalProperties": False}}, "required": ["user"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1,
     "maxItems": 3},
    {"type": "string", "enum": ["north", "south", "east", "west"]},
    {"anyOf": [WORD, {"type": "integer", "minimum": 0, "maximum": 99}]},
    {"type": "number", "minimum": -5.5, "maximum": 5.5},
    {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"},
    {"type": "boolean"},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": WORD}, "required": ["a"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
     "maximum": 9}}, "required": ["x"], "additionalProperties": False}, "minItems": 1, "maxItems": 2},
    {"const": "fixed"},
    {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
     "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"level": {"enum": ["low", "high"]}, "n": {"type": "integer",
     "exclusiveMinimum": 0, "maximum": 10}}, "required": ["level", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
     "required": ["when"], "additionalProperties": False},
    {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 2},
    {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"],
     "additionalProperties": False},
]
REGEXES = [r"(yes|no|maybe)", r"[0-9]{3}-[0-9]{4}", r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?"]
CHOICES = [("red", "green", "blue"), ("alpha", "beta")]
GRAMMARS = [  # (GBNF or Lark, a regex the text must match)
    ('root ::= num "+" num "=" num\nnum ::= [0-9] | [0-9] [0-9]', r"[0-9]{1,2}\+[0-9]{1,2}=[0-9]{1,2}"),
    ('start: "A" | "B" "C"', r"A|BC"),
]


def specs() -> list[tuple[Spec, object]]:
    """(spec, how to check an output)."""
    cases: list[tuple[Spec, object]] = [(Spec(json=schema), schema) for schema in SCHEMAS]
    cases += [(Spec(regex=regex), re.compile(regex)) for regex in REGEXES]
    cases += [(Spec(choice=choice), set(choice)) for choice in CHOICES]
    cases += [(Spec(grammar=grammar), re.compile(pattern)) for grammar, pattern in GRAMMARS]
    cases.append((Spec(json_object=True), {"type": "object"}))
    return cases


def assert_matches(text: str, check: object) -> None:
    if isinstance(check, dict):
        jsonschema.validate(json.loads(text), check)
    elif isinstance(check, set):
        assert text in check
    else:
        assert check.fullmatch(text), text


@pytest.fixture(scope="module")
def demo():
    with LLM(kv_cache_memory_gib=0.05) as llm:
        yield llm


def test_at_least_twenty_specs():
    assert len(specs()) >= 20


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_constrained_output_matches_and_neighbours_are_unchanged(demo, temperature):
    free = ["The paged attention kernel", "def main():"]
    free_params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [out.outputs[0].token_ids for out in demo.generate(free, free_params)]
    cases = specs()
    prompts = [f"Answer in the right format ({i}):" for i in range(len(cases))] + free
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=160, structured_outputs=spec)
              for i, (spec, _) in enumerate(cases)] + [free_params] * len(free)
    outputs = demo.generate(prompts, params)
    for (spec, check), out in zip(cases, outputs):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (spec, completion.text)
        assert_matches(completion.text, check)
        assert out.metrics.grammar_compile_s is not None
    assert [out.outputs[0].token_ids for out in outputs[len(cases):]] == alone
    manager = demo.engine.core.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_tiny_model_families(tiny_model_dirs):
    """A random model's free output is nowhere near JSON; constrained, it is JSON."""
    schema = SCHEMAS[0]
    for family in ("llama", "qwen3"):
        with LLM(str(tiny_model_dirs[family]), kv_cache_memory_gib=0.01) as llm:
            (out,) = llm.generate("x", SamplingParams(temperature=0, max_tokens=200,
                                                      structured_outputs=Spec(json=schema)))
            assert out.outputs[0].finish_reason == "stop"
            jsonschema.validate(json.loads(out.outputs[0].text), schema)


@pytest.mark.parametrize(("spec", "message"), [
    (Spec(json='{"type": "nonsense"}'), "nonsense"),
    (Spec(json="{not json"), "json"),
    (Spec(regex="a(b"), "unclosed group"),
    (Spec(grammar="root ::= missing"), "missing"),
])
def test_invalid_specs_are_refused_with_the_librarys_message(demo, spec, message):
    with pytest.raises(ValueError, match=message):
        check_grammar(spec)
    with pytest.raises(ValueError, match=message):
        demo.generate("x", SamplingParams(max_tokens=4, structured_outputs=spec))
    manager = demo.engine.core.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        Spec(regex="a", choice=("b",))
    with pytest.raises(ValueError, match="exactly one"):
        Spec()


def test_a_compiling_grammar_does_not_hold_back_the_step_loop(demo, monkeypatch):
    """The grammar compiles in the manager's thread: held there (an Event, as a slow compile
    that releases the GIL would be), the constrained request waits in the queue while its
    neighbour runs to its end; released, the constrained request completes in its schema."""
    from kvdeck.engine.grammar.matchers import GrammarManager

    held, entered = threading.Event(), threading.Event()
    compile_grammar = GrammarManager._compile

    def slow_compile(manager, spec):
        entered.set()
        assert held.wait(60), "the test never released the compile"
        return compile_grammar(manager, spec)

    monkeypatch.setattr(GrammarManager, "_compile", slow_compile)
    engine, schema = demo.engine, SCHEMAS[0]
    engine.add_request("held", "Answer in JSON:", SamplingParams(
        temperature=0, max_tokens=160, structured_outputs=Spec(json={**schema, "title": "held"})))
    engine.add_request("free", "def main():", SamplingParams(temperature=0, max_tokens=24,
                                                             ignore_eos=True))
    texts: dict[str, str] = {"held": "", "free": ""}
    finished: set[str] = set()
    try:
        while "free" not in finished:
            for out in engine.step():
                texts[out.request_id] += out.delta_text
                if out.finished:
                    finished.add(out.request_id)
        assert entered.is_set() and texts["held"] == "" and "held" not in finished
    finally:
        held.set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.delta_text
            if out.finished:
                assert out.outputs[0].finish_reason == "stop", texts[out.request_id]
    jsonschema.validate(json.loads(texts["held"]), schema)
    manager = engine.core.block_manager
    assert manager.num_free_blocks == manager.num_blocks
