"""/v1/completions and /v1/chat/completions on top of the async engine (AsyncLLM).

Checks live in admission.py, running and streaming in streaming.py, body pieces in
response_parts.py. Each prompt goes to the engine in one call (it tokenises off the event
loop, checks, and runs the n choices) and comes back as one stream whose outputs carry
their choice's index; choice i*n + j of the reply is prompt i's choice j, as OpenAI numbers
them.
"""

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from kvdeck.app.serve.admission import (
    Fields,
    ServeState,
    check_chat_template_kwargs,
    check_choice_count,
    check_engine,
    check_model,
    check_unsupported,
    sampling_params,
    submit,
)
from kvdeck.app.serve.echo import Echo, prompt_logprobs_asked, without_completion
from kvdeck.app.serve.errors import OpenAIError, sse_error
from kvdeck.app.serve.protocol import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from kvdeck.app.serve.response_parts import (
    chat_logprobs,
    completion_logprobs,
    prompt_list,
    prompt_logprobs_body,
    sse_event,
    usage,
)
from kvdeck.app.serve.streaming import EventStreamResponse, merged_outputs, run_to_end, stream_error
from kvdeck.app.serve.structured import (
    CallFormat,
    ToolCallStream,
    ToolPlan,
    plan_tools,
    structured_spec,
    tool_call_message,
)
from kvdeck.engine.api.async_llm import RequestStream
from kvdeck.engine.frontend.reasoning import ReasoningFormat, ReasoningStream, split_reasoning
from kvdeck.engine.types.outputs import RequestOutput

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def create_completion(state: ServeState, req: CompletionRequest, raw: Request):
    lora = check_model(state, req.model)
    model_name = lora.lora_name if lora is not None else state.model_name  # as vLLM echoes it
    check_engine(state)
    check_unsupported(req)
    for name, bad in (("suffix", req.suffix is not None), ("best_of", req.best_of not in (None, 1))):
        if bad:
            raise OpenAIError(400, f"{name} is not supported", param=name,
                              code="unsupported_parameter")
    if req.max_tokens == 0 and not req.echo:
        raise OpenAIError(400, "max_tokens must be at least 1 (0 is for echo: true, which returns "
                               "the prompt alone)", param="max_tokens")
    echo = Echo.of(req, state.engine.tokenizer)
    prompts = prompt_list(req.prompt)
    check_choice_count(state, len(prompts) * req.n, "n" if req.n > 1 else "prompt")
    state.metrics.observe_request_params(req.n, req.max_tokens)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    structured, field = structured_spec(req)
    # echo with max_tokens 0 generates one token, which the reply leaves out (vLLM's way).
    max_tokens = 1 if echo is not None and echo.prompt_only else req.max_tokens
    params = sampling_params(req, max_tokens if max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS,
                             req.logprobs, structured, prompt_logprobs_asked(req))
    streams = await submit(state, [(f"{request_id}-{i}", p) for i, p in enumerate(prompts)], params,
                           Fields("prompt", field, req.max_tokens is not None), lora_request=lora)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        prompt_ids = ([s.prompt_token_ids for s in streams for _ in range(req.n)]
                      if req.return_token_ids else None)
        return EventStreamResponse(_completion_stream(state, streams, request_id, include_usage,
                                                      req.logprobs, req.n, prompt_ids, model_name, echo),
                                   streams)
    finals = [out for outs in await run_to_end(streams, raw, state.drain) for out in outs]
    if echo is not None and echo.prompt_only:
        finals = [without_completion(out) for out in finals]
    choices = []
    for i, out in enumerate(finals):
        text, logprobs = out.outputs[0].text, completion_logprobs(out, 0, req.logprobs)
        if echo is not None:
            text, logprobs = echo.text(out) + text, echo.logprobs(out, req.logprobs)
        choices.append({"index": i, "text": text, "logprobs": logprobs,
                        "finish_reason": out.outputs[0].finish_reason,
                        "stop_reason": out.outputs[0].stop_reason})
        if req.prompt_logprobs is not None:
            choices[-1]["prompt_logprobs"] = prompt_logprobs_body(out)
    if req.return_token_ids:
        for choice, out in zip(choices, finals, strict=True):
            choice["prompt_token_ids"] = out.prompt_token_ids
            choice["token_ids"] = out.outputs[0].token_ids
    return JSONResponse({"id": request_id, "object": "text_completion", "created": int(time.time()),
                         "model": model_name, "choices": choices,
                         "usage": usage(finals, req.n)})


async def _completion_stream(state: ServeState, streams: list[RequestStream], request_id: str,
                             include_usage: bool, logprobs: int | None, choices_per_prompt: int,
                             prompt_ids: list[list[int]] | None,
                             model_name: str, echo: Echo | None = None) -> AsyncIterator[str]:
    """prompt_ids: given when the request asked for return_token_ids (vLLM's shape: the
    prompt's ids on a choice's first chunk, each chunk's new token ids on it). `echo`: a
    choice's first chunk starts with the prompt (and its logprobs)."""
    created = int(time.time())
    sent_tokens = [0] * (len(streams) * choices_per_prompt)  # tokens already sent, per choice
    finals: list[RequestOutput | None] = [None] * len(sent_tokens)
    echoed = [echo is None] * len(sent_tokens)
    try:
        async with aclosing(merged_outputs(streams, state.drain)) as outputs:
            async for prompt_index, out in outputs:
                completion = out.outputs[0]
                index = prompt_index * choices_per_prompt + completion.index
                if echo is not None and echo.prompt_only:
                    if completion.finish_reason is None:
                        continue  # the one token generated for it is never sent
                    out = without_completion(out)
                    completion = out.outputs[0]
                if completion.finish_reason is not None:
                    finals[index] = out
                elif not out.delta_text and logprobs is None and echoed[index]:
                    continue  # text held back (partial character or possible stop string)
                text = out.delta_text
                chunk_logprobs = completion_logprobs(out, sent_tokens[index], logprobs)
                if not echoed[index]:
                    echoed[index] = True
                    prompt_text = echo.text(out)
                    text = prompt_text + text
                    if logprobs is not None:  # the prompt's, then this chunk's (none sent before)
                        chunk_logprobs = echo.logprobs(out, logprobs)
                choice = {"index": index, "text": text, "logprobs": chunk_logprobs,
                          "finish_reason": completion.finish_reason,
                          "stop_reason": completion.stop_reason}
                if prompt_ids is not None:
                    if prompt_ids[index] is not None:
                        choice["prompt_token_ids"], prompt_ids[index] = prompt_ids[index], None
                    choice["token_ids"] = completion.token_ids[sent_tokens[index]:]
                sent_tokens[index] = len(completion.token_ids)
                chunk = {"id": request_id, "object": "text_completion", "created": created,
                         "model": model_name, "choices": [choice]}
                if include_usage:
                    chunk["usage"] = None
                yield sse_event(chunk)
        if include_usage:
            yield sse_event({"id": request_id, "object": "text_completion", "created": created,
                        "model": model_name, "choices": [],
                        "usage": usage(finals, choices_per_prompt)})
    except Exception as exc:  # every stream ends with an error event and [DONE], never cut
        yield sse_error(stream_error(exc))
    yield "data: [DONE]\n\n"


@dataclass(slots=True)
class ChatRun:
    """A chat request the engine runs: its stream and how to read the reply back."""

    request_id: str
    streams: list[RequestStream]
    tools: ToolPlan
    reasoning: ReasoningFormat | None  # None under a grammar: no thinking block to find
    logprobs: int | None  # top logprobs per token (None: none asked)
    model_name: str  # as the reply names it (an adapter's name under an adapter)


def translated_chat_request(fields: dict) -> ChatCompletionRequest:
    """Another API's request (the Responses or the Messages API) as the chat request it amounts
    to. A value that API's own model let through but chat's refuses (more messages than chat
    takes) is a 400 naming chat's field, which the caller renames."""
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise OpenAIError(400, f"{where}: {first['msg']}", param=str(first["loc"][0])) from None


def renamed(error: OpenAIError, fields: dict[str, str]) -> OpenAIError:
    """A chat-route error in another API's field names (`fields`: chat's name -> its own;
    the message's mentions of response_format too)."""
    error.param = fields.get(error.param, error.param)
    if "response_format" in fields:
        error.message = error.message.replace("response_format", fields["response_format"])
    return error


async def start_chat(state: ServeState, req: ChatCompletionRequest, request_id: str,
                     prompt_field: str = "messages", max_tokens_is_cap: bool = False) -> ChatRun:
    """Check a chat request and hand it to the engine (the Responses and Messages APIs' routes
    come through here too: `prompt_field` names their input in errors, and their token limit
    is a cap, never an error for a long prompt: `max_tokens_is_cap`)."""
    lora = check_model(state, req.model)
    model_name = lora.lora_name if lora is not None else state.model_name
    check_engine(state)
    check_unsupported(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    check_choice_count(state, req.n, "n")
    structured, field = structured_spec(req)
    tools = plan_tools(req, getattr(state.engine.tokenizer, "chat_template", None),
                       state.tool_call_parser, structured)
    if tools.constraint is not None:
        if structured is not None and not tools.holds_answer:
            raise _constraint_clash(req, field, tools.generic is not None)
        structured, field = tools.constraint, field if tools.holds_answer else "tools"
    check_chat_template_kwargs(req.chat_template_kwargs)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(req, max_tokens, logprobs, structured,  # bad values fail early
                             req.prompt_logprobs)
    state.metrics.observe_request_params(req.n, max_tokens)
    given = max_tokens is not None and not max_tokens_is_cap
    streams = await submit(state, [(request_id, None)], params,
                           Fields(prompt_field, field, given),
                           messages=tools.messages([m.for_template() for m in req.messages]),
                           tools=tools.template_tools, lora_request=lora,
                           chat_template_kwargs=req.chat_template_kwargs)
    # A grammar holds the reply from its first token: no reasoning block to find there.
    reasoning = state.reasoning if structured is None else None
    return ChatRun(request_id, streams, tools, reasoning, logprobs, model_name)


async def create_chat_completion(state: ServeState, req: ChatCompletionRequest, raw: Request):
    run = await start_chat(state, req, f"chatcmpl-{uuid.uuid4().hex}")
    request_id, streams, tools, reasoning = run.request_id, run.streams, run.tools, run.reasoning
    logprobs, model_name = run.logprobs, run.model_name
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStreamResponse(_chat_stream(
            state, streams, request_id, include_usage, logprobs, req.n, tools.call_format,
            req.parallel_tool_calls, req.return_token_ids, model_name, reasoning), streams)
    (finals,) = await run_to_end(streams, raw, state.drain)
    choices = []
    for i, out in enumerate(finals):
        completion = out.outputs[0]
        thought, answer = split_reasoning(reasoning, completion.text, True)
        message, called = {"role": "assistant", "content": answer}, False
        if tools.call_format is not None:
            message, called = tool_call_message(tools.call_format, answer, req.parallel_tool_calls)
        if thought:
            message.update(reasoning_fields(thought))
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(out, 0, logprobs),
                        "finish_reason": "tool_calls" if called else completion.finish_reason,
                        "stop_reason": completion.stop_reason})
        if req.return_token_ids:
            choices[-1]["token_ids"] = completion.token_ids
    body = {"id": request_id, "object": "chat.completion", "created": int(time.time()),
            "model": model_name, "choices": choices, "usage": usage(finals, len(finals))}
    if req.return_token_ids:
        body["prompt_token_ids"] = streams[0].prompt_token_ids
    if req.prompt_logprobs is not None:  # the rendered conversation's tokens (vLLM's place)
        body["prompt_logprobs"] = prompt_logprobs_body(finals[0])
    return JSONResponse(body)


def reasoning_fields(text: str) -> dict:
    """A reply's reasoning under vLLM's name (`reasoning`) and its older one, which DeepSeek's
    API and llama.cpp use (`reasoning_content`): clients read one or the other."""
    return {"reasoning": text, "reasoning_content": text}


def _constraint_clash(req: ChatCompletionRequest, field: str | None, generic: bool) -> OpenAIError:
    if generic:
        return OpenAIError(400, f"this model's chat template does not render tools, so they are "
                                f"served in the generic format, whose reply is held to a grammar; "
                                f"only a JSON schema or json_object can shape its answer, and only "
                                f"with tool_choice \"auto\": drop {field}, or give tool_choice "
                                "\"none\"", param=field)
    choice = req.tool_choice
    name = choice.function.name if isinstance(choice, NamedToolChoice) else choice
    return OpenAIError(400, f"tool_choice {name!r} and {field} both constrain the output; give "
                            "one", param="tool_choice")


async def _chat_stream(state: ServeState, streams: list[RequestStream], request_id: str,
                       include_usage: bool, logprobs: int | None, n: int,
                       tool_format: CallFormat | None = None,
                       parallel_tool_calls: bool = True,
                       return_token_ids: bool = False,
                       model_name: str | None = None,
                       reasoning: ReasoningFormat | None = None) -> AsyncIterator[str]:
    """return_token_ids: vLLM's shape (the prompt's ids on the first chunk, each chunk's new
    token ids on its choice). `reasoning`: the thinking goes in `reasoning` deltas, the
    answer (what a tool-call parser reads) in `content`."""
    prompt_ids = streams[0].prompt_token_ids if return_token_ids else None
    created = int(time.time())
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created,
            "model": model_name or state.model_name}

    def chunk(index: int, delta: dict, finish_reason=None, chunk_logprobs=None,
              stop_reason=None, token_ids: list[int] | None = None, **top) -> str:
        choice = {"index": index, "delta": delta, "logprobs": chunk_logprobs,
                  "finish_reason": finish_reason, "stop_reason": stop_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        body = {**base, **top, "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return sse_event(body)

    sent_tokens = [0] * n
    finals: list[RequestOutput | None] = [None] * n
    # With tools, text goes through a parser that turns calls into tool_calls deltas.
    tool_streams = [ToolCallStream(tool_format, parallel_tool_calls) if tool_format else None
                    for _ in range(n)]
    reasoners = [ReasoningStream(reasoning) for _ in range(n)]
    try:
        async with aclosing(merged_outputs(streams, state.drain)) as outputs:
            for index in range(n):
                top = {"prompt_token_ids": prompt_ids} if prompt_ids and index == 0 else {}
                yield chunk(index, {"role": "assistant", "content": ""}, **top)
            async for _, out in outputs:
                completion = out.outputs[0]
                index = completion.index
                tool_stream = tool_streams[index]
                if completion.finish_reason is not None:
                    finals[index] = out
                elif not out.delta_text and logprobs is None:
                    continue
                chunk_logprobs = chat_logprobs(out, sent_tokens[index], logprobs)
                new_ids = (completion.token_ids[sent_tokens[index]:]
                           if prompt_ids is not None else None)
                sent_tokens[index] = len(completion.token_ids)
                finish = completion.finish_reason
                done = finish is not None
                thought, new_text, answer = reasoners[index].update(completion.text, done)
                delta = reasoning_fields(thought) if thought else {}
                if tool_stream is None:
                    if new_text:
                        delta["content"] = new_text
                else:
                    content, calls = tool_stream.update(answer, done)
                    if content:
                        delta["content"] = content
                    if calls:
                        delta["tool_calls"] = calls
                    if done and tool_stream.called:
                        finish = "tool_calls"
                if not delta and not done and logprobs is None and new_ids is None:
                    continue  # text held back by a parser: nothing to tell yet
                yield chunk(index, delta, finish, chunk_logprobs, completion.stop_reason, new_ids)
        if include_usage:
            yield sse_event({**base, "choices": [], "usage": usage(finals, len(finals))})
    except Exception as exc:  # every stream ends with an error event and [DONE], never cut
        yield sse_error(stream_error(exc))
    yield "data: [DONE]\n\n"
