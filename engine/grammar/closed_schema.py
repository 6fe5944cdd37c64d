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
mean: the members of an `allOf` and a schema with an `allOf` or a `$ref` beside its own
`properties` (in both, keys listed elsewhere are allowed too). Their nested schemas are
closed as any other.

Pure Python: the front-end builds tool-call grammars with it, without a grammar library.
"""

from typing import Any

# Keywords whose value is one schema, a list of schemas, or a name -> schema mapping.
_ONE_SCHEMA = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems",
               "unevaluatedItems", "contains", "not", "if", "then", "else", "propertyNames")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


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
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_closed(item, may_close=False) for item in out["allOf"]]
    lists_keys = "properties" in out or "patternProperties" in out
    combined = "allOf" in out or "$ref" in out
    said = "additionalProperties" in out or "unevaluatedProperties" in out
    if may_close and lists_keys and not combined and not said:
        out["additionalProperties"] = False
        unlisted = [name for name in out.get("required") or () if isinstance(name, str)
                    and name not in (out.get("properties") or {})]
        if unlisted and isinstance(out.get("properties", {}), dict):  # required: any value
            out["properties"] = {**out.get("properties", {}), **{name: {} for name in unlisted}}
    return out
