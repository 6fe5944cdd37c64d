"""JSON schemas with their objects closed: an object schema that lists `properties` (or
`patternProperties`) and says nothing of `additionalProperties` gets `false`, so a model
writes the keys the schema names and no others.

JSON Schema allows any extra key by default, and a grammar that follows it lets a small
model invent keys until `max_tokens` cuts the JSON short. vLLM's default grammar backend
(xgrammar, strict mode) and llama.cpp's schema converter (behind Ollama's `format`) both
close such objects; kvdeck does the same. A schema that wants extra keys says so
(`"additionalProperties": true` or a schema), and is left as it is.

A key the object requires but does not list is listed, with any value (closing would
otherwise make it impossible). Left open, because closing them would change what they
mean: an object whose `$ref` or in-place parts (`allOf`, `anyOf`, `oneOf`, `if`/`then`/
`else`, `dependentSchemas`) name keys too, those parts when the object names its own, the
parts of an `allOf` (they meet each other), and an `if` or a `not` (closing them would
change what they match). The alternatives of a union that names no keys of its own (an
`anyOf` of objects) are closed, and nested schemas are closed as any other.

Pure Python: the front-end builds tool-call grammars with it, without a grammar library.
"""

from typing import Any

# Where a schema sits. Beside the instance's own value (properties, items...) a closed
# object changes nothing else; "in place" (applied to the same instance as the schema that
# holds it) its keys meet the holder's and its siblings', so closing one would forbid theirs.
_ONE_SCHEMA = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems",
               "unevaluatedItems", "contains", "propertyNames")
_SCHEMA_LISTS = ("prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_IN_PLACE_ONE = ("if", "then", "else", "not")
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAPS = ("dependentSchemas",)
# In place, but never closed: the parts of an allOf meet each other; closing an `if` or a
# `not` would change which values they match.
_NEVER_CLOSED = ("allOf", "if", "not")


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` with its object schemas closed (see the module's docstring)."""
    return _closed(schema, may_close=True)


def _closed(node: Any, may_close: bool) -> Any:
    if not isinstance(node, dict):
        return node  # true/false schemas, or a value the grammar library will refuse
    out = dict(node)
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key], may_close=True)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(item, may_close=True) for item in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub, may_close=True) for name, sub in out[key].items()}
    lists_keys = "properties" in out or "patternProperties" in out
    in_place = list(_in_place_members(node))
    # An alternative (anyOf, oneOf, then, else) is closed when its holder names no keys.
    for key in (*_IN_PLACE_ONE, *_IN_PLACE_LISTS, *_IN_PLACE_MAPS):
        closable = not lists_keys and key not in _NEVER_CLOSED
        value = out.get(key)
        if isinstance(value, dict) and key in _IN_PLACE_MAPS:
            out[key] = {name: _closed(sub, closable) for name, sub in value.items()}
        elif isinstance(value, dict):
            out[key] = _closed(value, closable)
        elif isinstance(value, list) and key in _IN_PLACE_LISTS:
            out[key] = [_closed(item, closable) for item in value]
    combined = "$ref" in out or any(_names_keys(member) for member in in_place)
    said = "additionalProperties" in out or "unevaluatedProperties" in out
    if may_close and lists_keys and not combined and not said:
        out["additionalProperties"] = False
        unlisted = [name for name in out.get("required") or () if isinstance(name, str)
                    and name not in (out.get("properties") or {})]
        if unlisted and isinstance(out.get("properties", {}), dict):  # required: any value
            out["properties"] = {**out.get("properties", {}), **{name: {} for name in unlisted}}
    return out


def _in_place_members(node: dict) -> Any:
    for key in _IN_PLACE_ONE:
        yield node.get(key)
    for key in _IN_PLACE_LISTS:
        yield from node.get(key) if isinstance(node.get(key), list) else ()
    for key in _IN_PLACE_MAPS:
        yield from node.get(key).values() if isinstance(node.get(key), dict) else ()


def _names_keys(member: Any) -> bool:
    """Whether an in-place member names keys (or may: a $ref), itself or in place."""
    if not isinstance(member, dict):
        return False
    return (any(key in member for key in ("properties", "patternProperties", "$ref"))
            or any(_names_keys(inner) for inner in _in_place_members(member)))
