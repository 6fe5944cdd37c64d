"""/v1/messages, Anthropic's Messages API (what Claude Code and Anthropic's SDKs speak), over
the chat route's machinery: a request becomes a chat request (`system` a system message, text
blocks a message's content, `tool_use` blocks an assistant's tool_calls, `tool_result` blocks
tool messages, client tools chat's function tools, `output_format` a response_format), runs
as one (start_chat), and its reply becomes content blocks: thinking (with
--reasoning-parser), text, tool_use. /v1/messages/count_tokens counts the prompt the same
request would render. Errors take Anthropic's shape (errors.py).
"""

import json
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kvdeck.app.serve.admission import (
    ServeState,
    bad_prompt,
    check_engine,
    check_model,
)
from kvdeck.app.serve.anthropic_protocol import CountTokensRequest, MessagesRequest, TextBlock
from kvdeck.app.serve.anthropic_stream import message_events, new_tool_use_id, stop_fields, usage
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.openai_routes import renamed, start_chat, translated_chat_request
from kvdeck.app.serve.openapi import ANTHROPIC_COUNT_RESPONSES, ANTHROPIC_MESSAGE_RESPONSES
from kvdeck.app.serve.protocol import ChatCompletionRequest
from kvdeck.app.serve.streaming import EventStreamResponse, run_to_end
from kvdeck.app.serve.structured import plan_tools, tool_call_message
from kvdeck.engine.frontend.reasoning import split_reasoning

# The chat request's field names in errors, as this API calls them.
_FIELD_NAMES = {"response_format": "output_format", "max_completion_tokens": "max_tokens",
                "stop": "stop_sequences"}


def install_anthropic_routes(app: FastAPI, state: ServeState) -> None:
    @app.post("/v1/messages", responses=ANTHROPIC_MESSAGE_RESPONSES)
    async def messages(body: MessagesRequest, raw: Request):
        return await create_message(state, body, raw)

    @app.post("/v1/messages/count_tokens", responses=ANTHROPIC_COUNT_RESPONSES)
    async def count_tokens(body: CountTokensRequest) -> JSONResponse:
        check_model(state, body.model)
        check_engine(state)
        try:
            chat = chat_request(body)
            tools = plan_tools(chat, getattr(state.engine.tokenizer, "chat_template", None),
                               state.tool_call_parser)
        except OpenAIError as error:
            raise renamed(error, _FIELD_NAMES) from None
        try:
            _, ids = await state.engine.encode_async(
                messages=tools.messages([m.for_template() for m in chat.messages]),
                tools=tools.template_tools, chat_template_kwargs=chat.chat_template_kwargs)
        except ValueError as exc:
            raise bad_prompt(exc, "messages") from None
        return JSONResponse({"input_tokens": len(ids)})


async def create_message(state: ServeState, req: MessagesRequest, raw: Request):
    message_id = f"msg_{uuid.uuid4().hex}"
    try:
        run = await start_chat(state, chat_request(req), message_id, max_tokens_is_cap=True)
    except OpenAIError as error:
        raise renamed(error, _FIELD_NAMES) from None
    parallel = not (req.tool_choice and req.tool_choice.disable_parallel_tool_use)
    if req.stream:
        return EventStreamResponse(message_events(state, run, message_id, parallel), run.streams)
    ((out,),) = await run_to_end(run.streams, raw, state.drain)
    thought, answer = split_reasoning(run.reasoning, out.outputs[0].text, True)
    content: list[dict] = []
    if thought:
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    text, calls = answer, []
    if run.tools.call_format is not None:
        message, _ = tool_call_message(run.tools.call_format, answer, parallel)
        text, calls = message["content"] or "", message.get("tool_calls", [])
    uses = []
    for call in calls:
        arguments = tool_input(call["function"]["arguments"])
        if arguments is None:  # not an object: the model's words, as text
            text += call["function"]["arguments"]
        else:
            uses.append({"type": "tool_use", "id": new_tool_use_id(),
                         "name": call["function"]["name"], "input": arguments})
    if text or not (uses or thought):
        content.append({"type": "text", "text": text})
    content += uses
    return JSONResponse({"id": message_id, "type": "message", "role": "assistant",
                         "model": run.model_name, "content": content,
                         **stop_fields(out, bool(uses)), "usage": usage(out)})


def tool_input(arguments: str) -> dict | None:
    """A call's arguments as the object Anthropic's `input` is (None: they are not one)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request this one is (its values already checked by MessagesRequest)."""
    choice = req.tool_choice
    tool_choice = None
    if choice is not None:
        if choice.type == "tool" and not choice.name:
            raise OpenAIError(400, "tool_choice of type 'tool' needs the tool's name",
                              param="tool_choice")
        tool_choice = ({"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
                       or {"type": "function", "function": {"name": choice.name}})
    fields: dict = {"model": req.model, "messages": chat_messages(req)}
    if isinstance(req, MessagesRequest):
        fields.update(max_completion_tokens=req.max_tokens, stop=req.stop_sequences,
                      temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        if req.output_format is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": req.output_format.schema_}}
    if req.tools:
        fields["tools"] = [{"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": tool.input_schema}}
            for tool in req.tools]
    fields["tool_choice"] = tool_choice
    fields["parallel_tool_calls"] = not (choice is not None and choice.disable_parallel_tool_use)
    if req.thinking is not None and req.thinking.type == "disabled":
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    return translated_chat_request(fields)


def chat_messages(req: CountTokensRequest) -> list[dict]:
    """The conversation as chat messages: a user turn's tool results first, as tool messages
    (named after their call), then its text; an assistant turn's text and its tool_use
    blocks as tool_calls; a system turn's text a system message where it stands (a template
    that takes one only first says so, a 400). Text blocks of one turn are joined by new
    lines."""
    messages: list[dict] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else \
            "\n".join(block.text for block in req.system)
        messages.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for message in req.messages:
        texts = [block.text for block in message.content if isinstance(block, TextBlock)]
        if message.role == "system":
            messages.append({"role": "system", "content": "\n".join(texts)})
            continue
        if message.role == "assistant":
            calls = [{"id": block.id, "type": "function",
                      "function": {"name": block.name, "arguments": json.dumps(block.input)}}
                     for block in message.content if block.type == "tool_use"]
            names.update((call["id"], call["function"]["name"]) for call in calls)
            turn: dict = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                turn["tool_calls"] = calls
            elif turn["content"] is None:
                turn["content"] = ""
            messages.append(turn)
            continue
        for block in message.content:
            if block.type == "tool_result":
                result = {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
                if block.tool_use_id in names:
                    result["name"] = names[block.tool_use_id]
                messages.append(result)
        if texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    if not messages:
        raise OpenAIError(400, "messages hold no text or tool result to answer (thinking blocks "
                               "alone are left out)", param="messages")
    return messages
