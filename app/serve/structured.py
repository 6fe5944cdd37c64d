"""Structured outputs and tool calls on the OpenAI API: requests to grammar specs, and
generated text back to OpenAI's `tool_calls` (whole, or as streamed deltas). Tools work
with every model: natively where the chat template renders them, in the generic format
(engine/frontend/generic_tools.py) where it does not. Other APIs (Ollama's) use
`plan_tool_use`, `tool_call_message` and `ToolCallStream` with plain dicts."""

import json
import uuid
from dataclasses import dataclass, field

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.protocol import ChatCompletionRequest, GuidedFields, NamedToolChoice
from kvdeck.engine.frontend.generic_tools import GenericTools
from kvdeck.engine.frontend.tool_calls import (
    FORMATS,
    ParsedText,
    ToolCallFormat,
    detect_format,
    parse,
)
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


CallFormat = ToolCallFormat | GenericTools  # how a reply's calls are written and read back


@dataclass(slots=True)
class ToolPlan:
    """What a chat request's tools mean for this model. A template that renders tools in a
    known family's format gets them natively (`fmt`); any other model gets the generic
    format (`generic`: the tools in the system prompt, the reply held to a grammar)."""

    template_tools: list[dict] | None = None  # given to the chat template
    fmt: ToolCallFormat | None = None  # parse calls out of the output in this format
    constraint: StructuredOutputsParams | None = None  # forces a call ("required", named)
    generic: GenericTools | None = None  # the generic format (fmt is None then)
    holds_answer: bool = False  # `constraint` also holds the answer to the request's schema

    @property
    def call_format(self) -> CallFormat | None:
        """How to read calls back out of the reply (None: the reply is only text)."""
        return self.fmt or self.generic

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation to render (the generic format describes the tools in it)."""
        return self.generic.with_prompt(messages) if self.generic is not None else messages


def plan_tools(req: ChatCompletionRequest, chat_template: str | None, parser: str | None,
               answer: StructuredOutputsParams | None = None) -> ToolPlan:
    """`plan_tool_use` for an OpenAI chat request (`answer`: its response_format's spec)."""
    tools = [tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        choice = choice.function.name
    return plan_tool_use(tools, choice, req.parallel_tool_calls, chat_template, parser, answer)


def plan_tool_use(tools: list[dict] | None, tool_choice: str | None = None, parallel: bool = True,
                  chat_template: str | None = None, parser: str | None = None,
                  answer: StructuredOutputsParams | None = None) -> ToolPlan:
    """The plan for `tools` (OpenAI's: {"type": "function", "function": {"name",
    "description", "parameters"}}) and `tool_choice`: None, "none", "auto", "required", or
    the name of one function to call. `chat_template` is the model's, `parser` the server's
    --tool-call-parser (None: read the format from the template), `answer` the request's own
    output constraint (a JSON schema or json_object shapes the generic format's plain
    answer: then `plan.holds_answer`; any other constraint is the caller's to refuse when
    `plan.constraint` is set too). Then:
    `plan.messages(messages)` and `plan.template_tools` go to the chat template,
    `plan.constraint` to the sampling params, and `tool_call_message(plan.call_format, text,
    parallel)` or a `ToolCallStream(plan.call_format, parallel)` turn the reply back into
    OpenAI's message or deltas. Bad requests raise OpenAIError (400)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolPlan()
    functions = [tool["function"] for tool in tools]
    named = tool_choice not in (None, "none", "auto", "required")
    if named:
        functions = [f for f in functions if f["name"] == tool_choice]
        if not functions:
            known = ", ".join(repr(tool["function"]["name"]) for tool in tools)
            raise OpenAIError(400, f"tool_choice names {tool_choice!r}, which is not in tools "
                                   f"({known}); name one of those, or give \"auto\" or "
                                   "\"required\"", param="tool_choice")
    fmt = FORMATS[parser] if parser else detect_format(chat_template)
    native = fmt is not None and "tools" in (chat_template or "")
    if tool_choice == "none":  # the tools are not offered (the generic format shows none)
        return ToolPlan(tools if native else None)
    if not native:
        generic = GenericTools(functions, may_answer=tool_choice in (None, "auto"),
                               parallel=parallel and not named)
        holds = generic.may_answer and answer is not None and answer.kind in ("json", "json_object")
        if holds:
            generic.answer_schema = json.loads(answer.json) if answer.json else {"type": "object"}
        return ToolPlan(constraint=StructuredOutputsParams(grammar=generic.grammar()),
                        generic=generic, holds_answer=holds)
    if tool_choice == "required" or named:
        forced = StructuredOutputsParams(grammar=fmt.grammar(functions, parallel and not named))
        return ToolPlan(tools, fmt, forced)
    return ToolPlan(tools, fmt)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def split_reply(fmt: CallFormat, text: str, final: bool) -> ParsedText:
    """The reply's content and calls; once `final`, only complete calls, and a reply with
    none is all content (the generic format's plain answer: its decoded text)."""
    generic = isinstance(fmt, GenericTools)
    parsed = fmt.parse(text, final) if generic else parse(fmt, text, final)
    if final:
        parsed.calls = [call for call in parsed.calls if call.complete]
        if not parsed.calls and not generic:
            parsed.content = text
    return parsed


def tool_call_message(fmt: CallFormat, text: str, parallel: bool) -> tuple[dict, bool]:
    """The assistant message for finished text, and whether it called tools."""
    parsed = split_reply(fmt, text, final=True)
    calls = parsed.calls
    if not calls:
        return {"role": "assistant", "content": parsed.content}, False
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

    fmt: CallFormat
    parallel: bool = True
    content_sent: int = 0
    calls: list[_SentCall] = field(default_factory=list)

    def update(self, text: str, final: bool) -> tuple[str, list[dict]]:
        parsed = split_reply(self.fmt, text, final)
        calls = parsed.calls if self.parallel else parsed.calls[:1]
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
