"""Tool calls as model families write them: the format a chat template teaches its model,
a grammar that forces a call in that format (tool_choice "required" or a named function),
and a parser that finds calls in generated text, whole or as it streams.

Families: "hermes" (Qwen2.5/3, Hermes: `<tool_call>{"name", "arguments"}</tool_call>`),
"llama3_json" (Llama 3.x: `{"name", "parameters"}`, calls separated by ";"), "mistral"
(`[TOOL_CALLS][{"name", "arguments"}, ...]`). The family is read from the chat template
(`detect_format`) unless the server is told otherwise (--tool-call-parser).
"""

import json
import re
from dataclasses import dataclass, field

from kvdeck.engine.grammar.closed_schema import closed_objects

# Inside the forced calls, JSON is laid out as json.dumps does (as structured outputs).
# lenient: a keyword llguidance does not implement (propertyNames, which zod writes for
# records) is left unenforced rather than refusing the request; the app wrote the tools, not
# a grammar, and everything else in them still holds the call.
_CALL_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "lenient": True}


@dataclass(slots=True, frozen=True)
class ToolCallFormat:
    name: str
    begin: str  # before each call (for "mistral": before the list of calls)
    end: str  # after each call
    args_key: str  # "arguments" or "parameters"
    separator: str  # between calls
    in_list: bool = False  # the calls are the items of one JSON list

    def call_schema(self, tools: list[dict]) -> dict:
        """A JSON schema of one call to any of `tools` (OpenAI function definitions), their
        parameters' objects closed (no keys the function does not name)."""
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", self.args_key],
                  "properties": {"name": {"const": tool["name"]},
                                 self.args_key: closed_objects(tool.get("parameters")
                                                               or {"type": "object"})}}
                 for tool in tools]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return {**schema, "x-guidance": _CALL_LAYOUT}

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        """A Lark grammar of one call (or, `parallel`, one or more) in this format."""
        call = f"%json {json.dumps(self.call_schema(tools))}"
        repeat = f"({json.dumps(self.separator)} call)*" if parallel else ""
        if self.in_list:
            return (f"start: {json.dumps(self.begin + '[')} call {repeat} \"]\"\n"
                    f"call: {call}\n")
        return (f"start: call {repeat}\n"
                f"call: {json.dumps(self.begin)} {call} {json.dumps(self.end)}\n")


FORMATS = {
    "hermes": ToolCallFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments", "\n"),
    "llama3_json": ToolCallFormat("llama3_json", "", "", "parameters", "; "),
    "mistral": ToolCallFormat("mistral", "[TOOL_CALLS]", "", "arguments", ", ", in_list=True),
}


def detect_format(chat_template: str | None) -> ToolCallFormat | None:
    """The family a chat template teaches (None: it renders no tools)."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|python_tag|>" in template or "ipython" in template:
        return FORMATS["llama3_json"]
    return None


@dataclass(slots=True)
class ParsedCall:
    name: str | None  # None until the name is complete
    arguments: str  # the arguments JSON as written so far (complete once `complete`)
    complete: bool


@dataclass(slots=True)
class ParsedText:
    content: str  # text outside the calls, as written (it grows as a prefix while streaming)
    calls: list[ParsedCall] = field(default_factory=list)
    pending: bool = False  # the text ends inside what may still become a call


def parse(fmt: ToolCallFormat, text: str, final: bool) -> ParsedText:
    """Split generated text into content and calls. While streaming (`final` False), text
    that may be the start of a call is held back (`pending`) instead of shown as content."""
    if fmt.in_list:
        return _parse_list(fmt, text, final)
    parsed = ParsedText("")
    position = 0
    while position < len(text):
        found = _find_call_start(fmt, text, position)
        if found is None:
            held = 0 if final else _partial_start(fmt, text, position)
            parsed.content += text[position:len(text) - held]
            parsed.pending = held > 0
            break
        content_end, start = found
        parsed.content += text[position:content_end]
        call, position = _parse_call(fmt, text, start + len(fmt.begin))
        if call is None:  # a malformed call: the rest is content
            parsed.content += text[start:]
            break
        parsed.calls.append(call)
        if not call.complete:
            parsed.pending = True
            break
        after_end = _skip(text, position, fmt.end)
        if fmt.end.strip() and after_end == _skip_space(text, position) and not final:
            if _partial_marker(fmt.end.strip(), text, _skip_space(text, position)) or \
                    _skip_space(text, position) >= len(text):
                parsed.pending = True  # the end marker is still arriving
                break
        position = _skip(text, after_end, fmt.separator.strip() or fmt.separator)
    return parsed


def _find_call_start(fmt: ToolCallFormat, text: str, position: int) -> tuple[int, int] | None:
    """(where the content before the next call ends, where the call's begin marker is)."""
    if fmt.begin:
        index = text.find(fmt.begin, position)
        return None if index < 0 else (index, index)
    # Llama 3.x JSON: a call is a JSON object that opens with its "name" key.
    match = re.compile(r'\s*(<\|python_tag\|>)?\s*\{\s*"name"').match(text, position)
    if match is None:
        return None
    return match.start(), text.index("{", match.start())


_BARE_CALL_STARTS = ('<|python_tag|>{"name"', '{"name"')


def _partial_start(fmt: ToolCallFormat, text: str, position: int) -> int:
    """How many characters at the end of `text` could be the start of a call."""
    if fmt.begin:
        return _partial_marker(fmt.begin, text, position)
    rest = text[position:]
    compact = re.sub(r"\s+", "", rest)
    if any(start.startswith(compact) for start in _BARE_CALL_STARTS):  # "" too: whitespace waits
        return len(rest)
    return 0


def _partial_marker(marker: str, text: str, position: int) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    if not marker:
        return 0
    for size in range(min(len(marker), len(text) - position), 0, -1):
        if marker.startswith(text[len(text) - size:]):
            return size
    return 0


def _parse_call(fmt: ToolCallFormat, text: str, start: int) -> tuple[ParsedCall | None, int]:
    """One call object from `start` (its "{"); also partial ones, while they stream."""
    brace = _skip_space(text, start)
    if brace >= len(text):
        return ParsedCall(None, "", False), len(text)
    if text[brace] != "{":
        return None, brace
    end = json_value_end(text, brace)
    body = text[brace:end if end is not None else len(text)]
    name = re.search(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
    arguments = ""
    key = re.search(rf'"{fmt.args_key}"\s*:\s*', body)
    if key is not None:
        args_start = brace + key.end()
        args_end = json_value_end(text, args_start)
        arguments = text[args_start:args_end if args_end is not None else len(text)]
    if end is None:
        return ParsedCall(_unescape(name.group(1)) if name else None, arguments, False), len(text)
    if name is None or key is None:
        return None, brace
    return ParsedCall(_unescape(name.group(1)), arguments.strip(), True), end


def _parse_list(fmt: ToolCallFormat, text: str, final: bool) -> ParsedText:
    start = text.find(fmt.begin)
    if start < 0:
        held = 0 if final else _partial_marker(fmt.begin, text, 0)
        return ParsedText(text[:len(text) - held], pending=held > 0)
    parsed = ParsedText(text[:start])
    position = _skip_space(text, start + len(fmt.begin))
    if position >= len(text):
        parsed.pending = True
        return parsed
    if text[position] != "[":
        return ParsedText(text)
    position += 1
    while True:
        position = _skip_space(text, position)
        if position >= len(text):
            parsed.pending = True
            return parsed
        if text[position] == "]":
            return parsed
        call, position = _parse_call(fmt, text, position)
        if call is None:
            return ParsedText(text)
        parsed.calls.append(call)
        if not call.complete:
            parsed.pending = True
            return parsed
        position = _skip_space(text, position)
        if position < len(text) and text[position] == ",":
            position += 1


def json_value_end(text: str, start: int) -> int | None:
    """Where the JSON value starting at `start` ends (None: it has not ended yet)."""
    position = _skip_space(text, start)
    if position >= len(text):
        return None
    if text[position] not in "{[":
        match = re.compile(r'"(?:[^"\\]|\\.)*"|[^,}\]\s]+').match(text, position)
        if match is None or match.end() >= len(text):
            return None
        return match.end()
    depth, in_string, escaped = 0, False, False
    for index in range(position, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _skip(text: str, position: int, token: str) -> int:
    position = _skip_space(text, position)
    if token and text.startswith(token.strip() or token, position):
        position += len(token.strip() or token)
    return position


def _unescape(value: str) -> str:
    try:
        return json.loads(f'"{value}"')
    except json.JSONDecodeError:
        return value
