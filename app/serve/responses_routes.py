"""/v1/responses, OpenAI's Responses API, over the chat route's machinery: a request becomes
a chat request (instructions a system message, input items messages, function calls an
assistant's tool_calls, their outputs tool messages, flat function tools chat's nested
ones, `text.format` a response_format), runs as one (start_chat), and its reply becomes
output items. Responses are kept in memory (responses_store.py) unless `store` is false, so
a request may continue one (`previous_response_id`) and a client may fetch or delete one.
"""

from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.openai_routes import ChatRun, renamed, start_chat, translated_chat_request
from kvdeck.app.serve.openapi import GENERATE_RESPONSES, errors
from kvdeck.app.serve.protocol import ChatCompletionRequest
from kvdeck.app.serve.response_parts import chat_logprobs
from kvdeck.app.serve.responses_output import (
    ResponseHeader,
    count_tokens,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
    text_part,
    tool_namespaces,
    usage,
)
from kvdeck.app.serve.responses_protocol import (
    LOGPROBS_INCLUDE,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
    joined,
)
from kvdeck.app.serve.responses_store import (
    STORED_RESPONSES,
    ResponseStore,
    StoredResponse,
    UnknownResponse,
    reply_messages,
)
from kvdeck.app.serve.responses_stream import response_events
from kvdeck.app.serve.streaming import EventStreamResponse, run_to_end
from kvdeck.app.serve.structured import tool_call_message
from kvdeck.engine.frontend.reasoning import split_reasoning

KEPT = (f"kvdeck keeps the last {STORED_RESPONSES} responses stored with store: true, in "
        "memory, until the server stops")
# The chat request's field names in errors, as this API calls them.
_FIELD_NAMES = {"response_format": "text.format", "messages": "input",
                "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                "logprobs": "include"}


def install_responses_routes(app: FastAPI, state: ServeState) -> None:
    store = ResponseStore()

    @app.post("/v1/responses", responses=GENERATE_RESPONSES)
    async def responses(body: ResponsesRequest, raw: Request):
        return await create_response(state, store, body, raw)

    # One route for both methods, so a 405 lists both in Allow.
    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"],
                   responses=errors(401, 404))
    async def kept_response(response_id: str, raw: Request) -> JSONResponse:
        """OpenAI's responses.retrieve (GET) and delete (DELETE)."""
        kept = _kept(store, response_id)
        if raw.method == "GET":
            return JSONResponse(kept.body)
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items", responses=errors(400, 401, 404))
    async def response_input_items(response_id: str,
                                   order: Literal["asc", "desc"] = "desc") -> JSONResponse:
        """The response's input items, newest first unless `order` is "asc" (OpenAI's)."""
        items = _kept(store, response_id).input_items
        items = items if order == "asc" else items[::-1]
        return JSONResponse({"object": "list", "data": items, "has_more": False,
                             "first_id": items[0]["id"] if items else None,
                             "last_id": items[-1]["id"] if items else None})


def _kept(store: ResponseStore, response_id: str) -> StoredResponse:
    try:
        return store.get(response_id)
    except UnknownResponse:
        raise OpenAIError(404, f"no response {response_id!r} is kept: {KEPT}",
                          param="response_id") from None


async def create_response(state: ServeState, store: ResponseStore, req: ResponsesRequest,
                          raw: Request):
    if req.conversation is not None:
        raise OpenAIError(400, "conversation is not supported: kvdeck keeps responses, not "
                               "conversations (continue one with previous_response_id, or send "
                               "the whole conversation in input)", param="conversation",
                          code="unsupported_parameter")
    earlier: list[dict] = []
    if req.previous_response_id is not None:
        try:
            earlier = store.conversation(req.previous_response_id)
        except UnknownResponse as missing:
            raise OpenAIError(400, f"previous_response_id: no response {missing.args[0]!r} is "
                                   f"kept: {KEPT}; send the conversation in input",
                              param="previous_response_id") from None
    if req.background:
        raise OpenAIError(400, "background is not supported: the reply comes in this request "
                               "(stream: true to read it as it is made)", param="background",
                          code="unsupported_parameter")
    if req.truncation == "auto":
        raise OpenAIError(400, "truncation 'auto' is not supported: an input over the context "
                               "fails (\"disabled\"); shorten the conversation",
                          param="truncation", code="unsupported_parameter")
    header = ResponseHeader(req, state.model_name)
    try:
        turn = item_messages(req)
        run = await start_chat(state, chat_request(req, earlier + turn), header.id,
                               prompt_field="input", max_tokens_is_cap=True)
    except OpenAIError as error:
        raise renamed(error, _FIELD_NAMES) from None
    header.model_name = run.model_name

    def keep(body: dict) -> None:
        if req.store:
            store.put(StoredResponse(body, turn + reply_messages(body["output"]),
                                     input_items(req), req.previous_response_id))

    if req.stream:
        return EventStreamResponse(response_events(state, header, run, keep), run.streams)
    ((out,),) = await run_to_end(run.streams, raw, state.drain)
    status, reason = status_of(out)
    thought, answer = split_reasoning(run.reasoning, out.outputs[0].text, True)
    output = _output_items(run, req, out, thought, answer, status)
    body = header.body(status, output, usage(out, count_tokens(state.engine.tokenizer, thought)),
                       incomplete_reason=reason)
    keep(body)
    return JSONResponse(body)


def _output_items(run: ChatRun, req: ResponsesRequest, out, thought: str, answer: str,
                  status: str) -> list[dict]:
    items = [reasoning_item(new_id("rs"), thought, status)] if thought else []
    content, calls = answer, []
    if run.tools.call_format is not None:
        message, _ = tool_call_message(run.tools.call_format, answer, req.parallel_tool_calls)
        content, calls = message["content"], message.get("tool_calls", [])
    if content or not (calls or thought):  # a reply that is all reasoning has no message
        logprobs = chat_logprobs(out, 0, run.logprobs)
        items.append(message_item(new_id("msg"), [text_part(
            content or "", logprobs["content"] if logprobs is not None else None)], status))
    namespaces = tool_namespaces(req)
    items += [function_call_item(new_id("fc"), call["id"], call["function"]["name"],
                                 call["function"]["arguments"], status,
                                 namespaces.get(call["function"]["name"])) for call in calls]
    return items


def chat_request(req: ResponsesRequest, conversation: list[dict]) -> ChatCompletionRequest:
    """The chat request this one is, `conversation` its messages after the instructions
    (its values already checked by ResponsesRequest)."""
    fmt = req.text.format if req.text is not None else None
    response_format = None
    if fmt is not None and fmt.type == "json_object":
        response_format = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if not fmt.schema_:
            raise OpenAIError(400, "text.format json_schema needs a schema", param="text.format")
        response_format = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}
    tool_choice = req.tool_choice
    if tool_choice is not None and not isinstance(tool_choice, str):
        tool_choice = {"type": "function", "function": {"name": tool_choice.name}}
    logprobs = LOGPROBS_INCLUDE in (req.include or [])
    if req.top_logprobs and not logprobs:
        raise OpenAIError(400, f"top_logprobs needs include [\"{LOGPROBS_INCLUDE}\"]",
                          param="top_logprobs")
    sampling = {name: getattr(req, name) for name in (
        "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "seed", "stop", "chat_template_kwargs")}
    return translated_chat_request({
        **sampling, "max_completion_tokens": req.max_output_tokens,
        "messages": ([{"role": "system", "content": req.instructions}] if req.instructions
                     else []) + conversation,
        "tools": [{"type": "function", "function": tool.model_dump(
                      exclude={"type", "namespace"}, exclude_none=True)}
                  for tool in req.tools] if req.tools else None,
        "tool_choice": tool_choice, "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format, "logprobs": logprobs,
        "top_logprobs": req.top_logprobs if logprobs else None,
    })


def item_messages(req: ResponsesRequest) -> list[dict]:
    """The input items as chat messages: the calls of one turn join the assistant message
    they follow; a call's output names its function (templates that show a tool result's
    name read it)."""
    messages: list[dict] = []
    names: dict[str, str] = {}
    for item in req.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": joined(item.content)})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            message = {"role": "tool", "tool_call_id": item.call_id, "content": joined(item.output)}
            if item.call_id in names:
                message["name"] = names[item.call_id]
            messages.append(message)
    if not messages:
        raise OpenAIError(400, "input has no message (reasoning items alone give the model "
                               "nothing to answer)", param="input")
    return messages


_ITEM_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                  "reasoning": "rs"}


def input_items(req: ResponsesRequest) -> list[dict]:
    """The input as input_items lists it: each item with an id, a message's text as parts."""
    listed = []
    for item in req.input:
        body = {"id": new_id(_ITEM_PREFIXES[item.type]), **item.model_dump(exclude_none=True)}
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            body["content"] = [{"type": kind, "text": item.content}]
        listed.append(body)
    return listed
