"""Tool calls for models whose chat template does not render tools (llama.cpp's "generic"
format): the tools and the shape of the reply go into the system prompt, and a grammar
holds the reply to one JSON object, either

    {"tool_calls": [{"name": "<function>", "arguments": {...}}, ...]}   a call (or several)
    {"response": "<text>"}                                              a plain answer

(the second only with tool_choice "auto"; with a response_format's schema, "response" is
a JSON value of that schema and the answer is its JSON text). Each call's arguments are
held to its function's JSON schema. Past turns go back to the template as plain text in the same
shapes: an assistant's calls as the `tool_calls` JSON, a tool's result as a user message
`{"tool_response": {"name", "tool_call_id", "content"}}`.

Pure Python (no grammar library, no torch): the grammar is a Lark text with a `%json`
schema that the engine compiles like any other structured output.
"""

import json
import re
from dataclasses import dataclass

from kvdeck.engine.frontend.tool_calls import ParsedText, ToolCallFormat, json_value_end, parse
from kvdeck.engine.grammar.closed_schema import closed_objects

# The reply is laid out as json.dumps writes it (as structured outputs and native calls).
# lenient as tool_calls' calls: a tool schema's unimplemented keyword is left unenforced.
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
           "lenient": True}
# The calls object parses as a list of calls after this marker (tool_calls.parse does it).
_CALLS_FORMAT = ToolCallFormat("generic", '{"tool_calls": ', "", "arguments", ", ", in_list=True)
_CALLS_START = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*')
_RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*')
_PREFIXES = ('{"tool_calls": ', '{"response": ')
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(slots=True)
class GenericTools:
    """The generic format for one request: the functions the reply may call (OpenAI
    function definitions: name, description, parameters), whether it may answer in plain
    text instead (tool_choice "auto"), whether it may make several calls, and the schema
    of the answer (None: free text; else its JSON, as response_format asks)."""

    functions: list[dict]
    may_answer: bool = True
    parallel: bool = True
    answer_schema: dict | None = None

    def call_schema(self) -> dict:
        """A JSON schema of one call to any of the functions (their `$defs` hoisted to the
        top, where the `$ref`s of a schema nested in another resolve)."""
        calls, defs = [], {}
        for function in self.functions:
            parameters, own_defs = _hoisted(function["name"], function.get("parameters") or NO_PARAMETERS)
            defs.update(own_defs)
            calls.append({"type": "object", "additionalProperties": False,
                          "required": ["name", "arguments"],
                          "properties": {"name": {"const": function["name"]}, "arguments": parameters}})
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return {**schema, "$defs": defs} if defs else schema

    def reply_schema(self) -> dict:
        """A JSON schema of the whole reply, its objects closed (the arguments and the answer
        have no keys their schemas do not name)."""
        item = self.call_schema()
        defs = item.pop("$defs", None)
        calls: dict = {"type": "array", "items": item, "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        call = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                "properties": {"tool_calls": calls}}
        if self.may_answer:
            answer_schema, answer_defs = _hoisted("response", self.answer_schema or {})
            defs = {**(defs or {}), **answer_defs} or None
            answer = {"type": "object", "additionalProperties": False, "required": ["response"],
                      "properties": {"response": {"type": "string"} if self.answer_schema is None
                                     else answer_schema}}
            call = {"anyOf": [call, answer]}
        return closed_objects({**call, "$defs": defs} if defs else call)

    def grammar(self) -> str:
        """A Lark grammar of the reply (properties in order: a call's name comes first)."""
        return f"start: %json {json.dumps({**self.reply_schema(), 'x-guidance': _LAYOUT})}\n"

    def system_prompt(self) -> str:
        """The tools as JSON lines and the reply's shapes, in few words (small contexts)."""
        tools = "\n".join(json.dumps({key: function[key] for key in
                                      ("name", "description", "parameters") if key in function})
                          for function in self.functions)
        call = '{"tool_calls": [{"name": <tool>, "arguments": <its parameters>}]}'
        how_many = "one or more calls" if self.parallel else "one call"
        if self.may_answer:
            answer = '"<answer>"' if self.answer_schema is None else \
                f"<answer as JSON of this schema: {json.dumps(self.answer_schema)}>"
            shape = f'Reply in JSON: {call} ({how_many}), or {{"response": {answer}}}.'
        else:
            must = self.functions[0]["name"] if len(self.functions) == 1 else "a tool"
            shape = f"Reply in JSON: {call} ({how_many}); you must call {must}."
        return (f"Tools:\n{tools}\n{shape}\n"
                'Tool results come as {"tool_response": {"name", "content"}}.')

    def with_prompt(self, messages: list[dict]) -> list[dict]:
        """The conversation with the tools described in its system message (added first, or
        after the existing one's text) and past tool turns as plain text."""
        messages = history_as_text(messages)
        prompt = self.system_prompt()
        if messages and messages[0].get("role") in ("system", "developer"):
            first = messages[0]
            text = first.get("content") or ""
            return [{**first, "content": f"{text}\n\n{prompt}" if text else prompt}, *messages[1:]]
        return [{"role": "system", "content": prompt}, *messages]

    def parse(self, text: str, final: bool) -> ParsedText:
        """The reply split into content (a plain answer's text, decoded) and calls, whole or
        while it streams: what may still become either shape is held back (`pending`)."""
        if (match := _CALLS_START.match(text)) is not None:
            parsed = parse(_CALLS_FORMAT, _CALLS_FORMAT.begin + text[match.end():], final)
            if final and not any(call.complete for call in parsed.calls):
                return ParsedText(text)  # cut short (max_tokens): what was written, as it is
            return parsed
        if (match := _RESPONSE_START.match(text)) is not None:
            if self.answer_schema is not None:  # the answer is the value's JSON text
                end = json_value_end(text, match.end())
                answer = text[match.end():end].lstrip()
                return ParsedText(answer, pending=end is None and not final)
            if not text.startswith('"', match.end()):
                return ParsedText("", pending=not final) if match.end() == len(text) \
                    else ParsedText(text)
            answer, closed = _string_prefix(text, match.end() + 1)
            return ParsedText(answer, pending=not (closed or final))
        stripped = text.lstrip()
        if not final and any(prefix.startswith(stripped) for prefix in _PREFIXES):
            return ParsedText("", pending=True)
        return ParsedText(text)  # not the generic shape at all: the text as it is


def _hoisted(owner: str, schema: dict) -> tuple[dict, dict]:
    """`schema` without its `$defs`/`definitions`, its refs to them renamed "<owner>.<name>",
    and those definitions under their new names (to sit at the top of a larger schema)."""
    if not isinstance(schema, dict):
        return schema, {}
    schema = dict(schema)
    own = {**schema.pop("definitions", {}), **schema.pop("$defs", {})}
    if not own:
        return schema, {}

    def renamed(node):
        if isinstance(node, dict):
            node = {key: renamed(value) for key, value in node.items()}
            ref = node.get("$ref")
            for prefix in ("#/$defs/", "#/definitions/"):
                if isinstance(ref, str) and ref.startswith(prefix):
                    node["$ref"] = f"#/$defs/{owner}.{ref[len(prefix):]}"
            return node
        if isinstance(node, list):
            return [renamed(item) for item in node]
        return node

    return renamed(schema), {f"{owner}.{name}": renamed(value) for name, value in own.items()}


def history_as_text(messages: list[dict]) -> list[dict]:
    """`tool` messages and assistant `tool_calls` as turns any template shows: the calls as
    the assistant's JSON text, each result as a user message (joined to a user message
    right before it, for templates that insist on alternating roles)."""
    names: dict[str, str] = {}
    converted: list[dict] = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        role = message.get("role") if isinstance(message, dict) else None
        if calls:
            shown = [_call_json(call) for call in calls]
            for call, shown_call in zip(calls, shown, strict=True):
                names[str(call.get("id", ""))] = shown_call["name"]
            text = json.dumps({"tool_calls": shown})
            content = message.get("content")
            rest = {k: v for k, v in message.items() if k != "tool_calls"}
            converted.append({**rest, "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            result = {"content": message.get("content")}
            call_id = message.get("tool_call_id")
            if call_id is not None:
                result = {"tool_call_id": call_id, **result}
            name = names.get(call_id or "") or message.get("name")
            if name is not None:
                result = {"name": name, **result}
            text = json.dumps({"tool_response": result})
            if converted and converted[-1].get("role") == "user":
                previous = converted[-1]
                converted[-1] = {**previous, "content": f"{previous.get('content') or ''}\n{text}"}
            else:
                converted.append({"role": "user", "content": text})
        else:
            converted.append(message)
    return converted


def _call_json(call: object) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("each of an assistant message's tool_calls must be {'id', 'type': "
                         "'function', 'function': {'name', 'arguments'}}")
    arguments = function.get("arguments")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        pass  # shown as the string it is
    return {"name": function["name"], "arguments": arguments}


_PARTIAL_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{0,3})?$")
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


def _string_prefix(text: str, start: int) -> tuple[str, bool]:
    """The JSON string whose body starts at `start`, decoded as far as it has arrived
    (a prefix that only grows), and whether it is closed."""
    position, escaped = start, False
    while position < len(text):
        char = text[position]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return _decode(text[start:position]), True
        position += 1
    body = text[start:]
    # Hold back an escape still arriving, and a high surrogate until its pair comes.
    if escaped or (match := _PARTIAL_ESCAPE.search(body)) and _odd_backslashes(body, match.start()):
        body = body[:body.rindex("\\")]
    if (match := _HIGH_SURROGATE.search(body)) and _odd_backslashes(body, match.start()):
        body = body[:match.start()]
    return _decode(body), False


def _odd_backslashes(body: str, index: int) -> bool:
    """Whether the backslash at `index` starts an escape (is not itself escaped)."""
    count = 0
    while index - count - 1 >= 0 and body[index - count - 1] == "\\":
        count += 1
    return count % 2 == 0


def _decode(body: str) -> str:
    try:
        return json.loads(f'"{body}"')
    except json.JSONDecodeError:
        return body  # not valid JSON string text (no grammar held it): as written
