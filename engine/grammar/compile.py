"""Structured-output specs to grammars, and the check that a spec is valid.

The grammar library is llguidance, behind this module and `matchers.py` only. Chosen over
xgrammar because it imports no torch, so the front-end (which must not load torch) can
check a schema, regex or grammar when the request arrives and answer 400 with the
library's own message; because it builds grammars lazily (no seconds-long precompile per
schema); because one call fills the token bitmasks of a whole batch in parallel; and
because its matchers roll back, which speculative decoding needs.
"""

import json

from kvdeck.engine.grammar.closed_schema import closed_objects
from kvdeck.engine.types.structured import StructuredOutputsParams

ANY_JSON_OBJECT = '{"type": "object"}'
# JSON laid out as json.dumps does: ", " and ": " exactly, no other whitespace. A model
# allowed any whitespace between tokens can spend its whole budget on newlines.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    # Imported on first use: a machine without it (the lent GPU image) runs everything else.
    try:
        import llguidance
    except ImportError:
        raise ValueError("structured outputs need the llguidance package, which is not "
                         "installed") from None
    return llguidance


def grammar_definition(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for `spec` (ValueError when it cannot even be converted)."""
    llg = _llguidance()
    match spec.kind:
        case "json":
            return llg.LLMatcher.grammar_from_json_schema(_closed_schema(spec.json),
                                                          overrides=JSON_LAYOUT)
        case "json_object":
            return llg.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, overrides=JSON_LAYOUT)
        case "regex":
            return llg.LLMatcher.grammar_from_regex(spec.regex)
        case "choice":
            return llg.grammar_from("choice", json.dumps(list(spec.choice)))
        case _:  # GBNF / EBNF, or Lark
            return llg.grammar_from("grammar", spec.grammar)


def _closed_schema(text: str) -> str | dict:
    try:
        schema = json.loads(text)
    except ValueError:
        return text  # not JSON: the converter's own message says so
    return closed_objects(schema) if isinstance(schema, dict) else text


def check_grammar(spec: StructuredOutputsParams, what: str | None = None) -> None:
    """ValueError quoting the library's message when `spec` is not a valid grammar; `what`
    names it in the message (default: the API's field, `structured_outputs.json`)."""
    what = what or f"structured_outputs.{spec.kind}"
    llg = _llguidance()
    try:
        definition = grammar_definition(spec)
    except Exception as exc:  # the converters raise ValueError or their own exceptions
        raise ValueError(f"{what} is not valid: {exc}") from None
    error = llg.LLMatcher.validate_grammar(definition)
    if error and not error.startswith("WARNING"):
        raise ValueError(f"{what} is not valid: {_quoted(error.strip())}")


QUOTED_LINE_CHARS = 240


def _quoted(error: str) -> str:
    """llguidance's message quotes the grammar's line, which for a JSON schema is the whole
    schema (tens of KB for an agent's tools): each line cut to its first QUOTED_LINE_CHARS,
    where the column it points at is for short schemas."""
    return "\n".join(line if len(line) <= QUOTED_LINE_CHARS else line[:QUOTED_LINE_CHARS] + " …"
                     for line in error.splitlines())
