"""Structured outputs and tool calls on the OpenAI API: requests to grammar specs, and
generated text back to OpenAI's `tool_calls` (whole, or as streamed deltas)."""

import uuid
from dataclasses import dataclass, field

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.protocol import ChatCompletionRequest, GuidedFields, NamedToolChoice
from kvdeck.engine.frontend.tool_calls import FORMATS, ToolCallFormat, detect_format, parse
from kvdeck.engine.types.structured import StructuredOutputsParams


def structured_spec(req: GuidedFields) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's output constraint and the field that gave it (400 if several do)."""
    given: list[tuple[str, StructuredOutputsParams]] = []
    so = req.structured_outputs
    if so is not None:
        given.append(("structured_outputs", _spec("structured_outputs", json=so.json_, regex=so.regex,
                                                  choice=so.choice, grammar=so.grammar,
                                                  json_object=bool(so.json_object))))
    for name, kind in (("guided_json", "json"), ("guided_regex", "regex"),
                       ("guided_choice", "choice"), ("guided_grammar", "grammar")):
        value = getattr(req, name)
        if value is not None:
            given.append((name, _spec(name, **{kind: value})))
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", _spec("response_format", json_object=True)))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or not fmt.json_schema.schema_:
            raise OpenAIError(400, "response_format json_schema needs json_schema.schema",
                              param="response_format")
        given.append(("response_format", _spec("response_format", json=fmt.json_schema.schema_)))
    if len(given) > 1:
        raise OpenAIError(400, f"give one output constraint, not {', '.join(n for n, _ in given)}",
                          param=given[1][0])
    return (given[0][1], given[0][0]) if given else (None, None)


def _spec(param: str, **fields: object) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param=param) from None


@dataclass(slots=True)
class ToolPlan:
    """What a chat request's tools mean for this model."""

    template_tools: list[dict] | None = None  # given to the chat template
    fmt: ToolCallFormat | None = None  # parse calls out of the output in this format
    constraint: StructuredOutputsParams | None = None  # forces a call ("required", named)


def plan_tools(req: ChatCompletionRequest, chat_template: str | None, parser: str | None) -> ToolPlan:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolPlan()
    template_tools = [tool.model_dump(exclude_none=True) for tool in req.tools]
    if choice == "none":
        return ToolPlan(template_tools)
    fmt = FORMATS[parser] if parser else detect_format(chat_template)
    if fmt is None or "tools" not in (chat_template or ""):
        raise OpenAIError(400, "this model's chat template does not render tools, so the model "
                               "cannot call them (--tool-call-parser names the format if it can)",
                          param="tools", code="tools_unsupported")
    functions = [tool.function.model_dump(exclude_none=True) for tool in req.tools]
    if isinstance(choice, NamedToolChoice):
        functions = [f for f in functions if f["name"] == choice.function.name]
        if not functions:
            raise OpenAIError(400, f"tool_choice names {choice.function.name!r}, which is not in "
                                   "tools", param="tool_choice")
    if choice == "required" or isinstance(choice, NamedToolChoice):
        parallel = req.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
        forced = StructuredOutputsParams(grammar=fmt.grammar(functions, parallel))
        return ToolPlan(template_tools, fmt, forced)
    return ToolPlan(template_tools, fmt)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_message(fmt: ToolCallFormat, text: str, parallel: bool) -> tuple[dict, bool]:
    """The assistant message for finished text, and whether it called tools."""
    parsed = parse(fmt, text, final=True)
    calls = [call for call in parsed.calls if call.complete]
    if not calls:
        return {"role": "assistant", "content": text}, False
    if not parallel:
        calls = calls[:1]
    return {"role": "assistant", "content": parsed.content if parsed.content.strip() else None,
            "tool_calls": [{"id": new_call_id(), "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}}
                           for call in calls]}, True


@dataclass(slots=True)
class _SentCall:
    id: str
    arguments_sent: int = 0


@dataclass(slots=True)
class ToolCallStream:
    """Turns a choice's growing text into OpenAI's streamed deltas: content as it arrives,
    each call's name first (with its id) and then its arguments in pieces."""

    fmt: ToolCallFormat
    parallel: bool = True
    content_sent: int = 0
    calls: list[_SentCall] = field(default_factory=list)

    def update(self, text: str, final: bool) -> tuple[str, list[dict]]:
        parsed = parse(self.fmt, text, final)
        calls = parsed.calls if self.parallel else parsed.calls[:1]
        if final:
            calls = [call for call in calls if call.complete]
            if not calls:  # no call after all: everything is content
                parsed.content = text
        content = parsed.content[self.content_sent:]
        self.content_sent = len(parsed.content)
        deltas = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            if index == len(self.calls):
                self.calls.append(_SentCall(new_call_id()))
                deltas.append({"index": index, "id": self.calls[index].id, "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            sent = self.calls[index]
            if len(call.arguments) > sent.arguments_sent:
                deltas.append({"index": index,
                               "function": {"arguments": call.arguments[sent.arguments_sent:]}})
                sent.arguments_sent = len(call.arguments)
        return content, deltas

    @property
    def called(self) -> bool:
        return bool(self.calls)
