"""/v1/completions and /v1/chat/completions on top of the EngineClient.

A request is checked completely (model, engine state, sampling values, context length,
queue room) before anything is queued, so a bad request never disturbs the others; what
can never succeed is a 400, what may succeed later a 429 or 503 with Retry-After.
Tokenising and chat templates run off the event loop. n > 1 queues one engine request per
choice (frontend/parallel_sampling.py); choice i*n + j is prompt i's choice j, as OpenAI
numbers them.
"""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from kvdeck.app.serve.errors import OpenAIError, bad_request, sse_error
from kvdeck.app.serve.metrics import EngineMetrics
from kvdeck.app.serve.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from kvdeck.app.serve.shutdown import Drain
from kvdeck.app.serve.structured import ToolCallStream, plan_tools, structured_spec, tool_call_message
from kvdeck.engine.api.async_client import (
    EngineClient,
    EngineDeadError,
    EngineNotReadyError,
    RequestFailedError,
    RequestStream,
)
from kvdeck.engine.frontend.parallel_sampling import choice_params
from kvdeck.engine.frontend.tool_calls import ToolCallFormat
from kvdeck.engine.types.outputs import Logprob, RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "seed")
_PARAM_NAMES = frozenset(_SAMPLING_FIELDS + (
    "n", "max_tokens", "min_tokens", "stop", "stop_token_ids", "logprobs", "top_logprobs",
    "prompt", "messages", "max_completion_tokens"))


@dataclass(slots=True)
class ServeState:
    client: EngineClient
    metrics: EngineMetrics
    model_name: str  # what /v1/models lists and requests must name
    max_queue_len: int
    drain: Drain
    restart_delay: float | None = 1.0  # None: a dead engine stays down
    tool_call_parser: str | None = None  # the tool-call format, when not read from the template


class ServerShuttingDown(Exception):
    """The grace period after SIGTERM ran out with this request still running."""


@dataclass(slots=True)
class PreparedPrompt:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class EventStreamResponse(StreamingResponse):
    """SSE response that always closes its generator, so a disconnect aborts the request."""

    def __init__(self, content: AsyncIterator[str], streams: list[RequestStream]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._source = content
        self._streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._source.aclose()
            for stream in self._streams:  # also when the body never started
                stream.cancel()


# ---- checks shared by both endpoints -----------------------------------------------------
def check_model(state: ServeState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                               f"{state.model_name!r}", param="model", code="model_not_found")


ENGINE_START_RETRY_S = 5.0  # Retry-After while the engine is starting


def check_engine(state: ServeState) -> None:
    if state.drain.draining:
        raise OpenAIError(503, "the server is shutting down", code="server_shutting_down")
    health = state.client.health()
    if health.status == "ready":
        return
    if health.status == "starting":
        raise OpenAIError(503, f"the engine is starting: {health.detail}", code="engine_starting",
                          retry_after=ENGINE_START_RETRY_S)
    # Dead: back after the restart delay (and its start-up), unless restarts are off.
    retry = None if state.restart_delay is None else state.restart_delay + ENGINE_START_RETRY_S
    raise OpenAIError(503, f"the engine is {health.status}: {health.detail}",
                      code="engine_unavailable", retry_after=retry)


def check_choice_count(state: ServeState, num_choices: int, param: str) -> None:
    """Before anything is expanded: a request with more choices than the queue holds can
    never be queued (400, not 429)."""
    if num_choices > state.max_queue_len:
        raise OpenAIError(400, f"this request needs {num_choices} engine requests (prompts x n); "
                               f"the queue holds {state.max_queue_len} (--max-queue-len)",
                          param=param, code="too_many_choices")


def check_queue(state: ServeState, num_new: int) -> None:
    waiting = state.client.num_waiting
    if waiting + num_new > state.max_queue_len:
        raise OpenAIError(429, f"the queue is full ({waiting} requests waiting, "
                               f"--max-queue-len {state.max_queue_len}); retry later",
                          code="queue_full", retry_after=1)


def check_unsupported(req: SamplingRequest) -> None:
    if req.logit_bias:
        raise OpenAIError(400, "logit_bias is not supported", param="logit_bias",
                          code="unsupported_parameter")


def sampling_params(req: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                    structured: StructuredOutputsParams | None = None) -> SamplingParams:
    values = {name: getattr(req, name) for name in _SAMPLING_FIELDS
              if getattr(req, name) is not None}
    try:
        return SamplingParams(
            n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=req.stop or [],
            stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos, logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            structured_outputs=structured, **values)
    except ValueError as exc:
        raise bad_request(exc, _PARAM_NAMES) from None


async def check_constraint(state: ServeState, params: SamplingParams, field: str | None) -> None:
    """A schema, regex or grammar the grammar library refuses is a 400 quoting it."""
    if params.structured_outputs is None:
        return
    try:
        await state.client.check_grammar_async(params)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param=field, code="invalid_grammar") from None
    state.metrics.observe_constrained()


def prepare(state: ServeState, prompt_ids: list[int], params: SamplingParams,
            request_id: str, max_tokens_given: bool, prompt_field: str = "prompt") -> PreparedPrompt:
    client = state.client
    try:
        client.check_request(prompt_ids, params)
    except ValueError as exc:
        error = bad_request(exc, _PARAM_NAMES)
        if error.param == "prompt":
            error.param = prompt_field
        if "max_model_len" in error.message:
            error.code = "context_length_exceeded"
        raise error from None
    if params.max_tokens is None:
        params.max_tokens = client.max_model_len - len(prompt_ids)
    elif max_tokens_given and len(prompt_ids) + params.max_tokens > client.max_model_len:
        raise OpenAIError(
            400, f"this model's maximum context length is {client.max_model_len} tokens; you asked "
                 f"for {len(prompt_ids) + params.max_tokens} ({len(prompt_ids)} in the prompt, "
                 f"{params.max_tokens} to generate): shorten the prompt or lower max_tokens",
            param="max_tokens", code="context_length_exceeded")
    else:
        params.max_tokens = min(params.max_tokens, client.max_model_len - len(prompt_ids))
    return PreparedPrompt(request_id, prompt_ids, params)


def submit(state: ServeState, prepared: list[PreparedPrompt]) -> list[RequestStream]:
    """Check for queue room and queue, with no await in between (no other request can
    slip in); all or nothing."""
    check_queue(state, len(prepared))
    streams: list[RequestStream] = []
    try:
        for p in prepared:
            streams.append(state.client.add_request(p.prompt_token_ids, p.params,
                                                    request_id=p.request_id))
    except (ValueError, EngineDeadError, EngineNotReadyError) as exc:
        for stream in streams:
            stream.cancel()
        raise stream_error(exc) from None
    return streams


# ---- /v1/completions ---------------------------------------------------------------------
async def create_completion(state: ServeState, req: CompletionRequest, raw: Request):
    check_model(state, req.model)
    check_engine(state)
    check_unsupported(req)
    for name, bad in (("echo", req.echo), ("suffix", req.suffix is not None),
                      ("best_of", req.best_of not in (None, 1))):
        if bad:
            raise OpenAIError(400, f"{name} is not supported", param=name,
                              code="unsupported_parameter")
    prompts = _prompt_list(req.prompt)
    check_choice_count(state, len(prompts) * req.n, "n" if req.n > 1 else "prompt")
    state.metrics.observe_request_params(req.n, req.max_tokens)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    structured, field = structured_spec(req)
    params = sampling_params(req, req.max_tokens if req.max_tokens is not None
                             else COMPLETION_DEFAULT_MAX_TOKENS, req.logprobs, structured)
    await check_constraint(state, params, field)
    prepared = []
    for prompt in prompts:
        try:
            _, ids = await state.client.encode_async(prompt)
        except ValueError as exc:
            raise bad_prompt(exc, "prompt") from None
        for choice in choice_params(params):
            prepared.append(prepare(state, ids, choice, f"{request_id}-{len(prepared)}",
                                    req.max_tokens is not None))
    streams = submit(state, prepared)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStreamResponse(_completion_stream(state, streams, request_id, include_usage,
                                                      req.logprobs, req.n), streams)
    finals = await _run_to_end(streams, raw, state.drain)
    choices = [{"index": i, "text": out.outputs[0].text,
                "logprobs": _completion_logprobs(out, 0, req.logprobs),
                "finish_reason": out.outputs[0].finish_reason,
                "stop_reason": out.outputs[0].stop_reason} for i, out in enumerate(finals)]
    return JSONResponse({"id": request_id, "object": "text_completion", "created": int(time.time()),
                         "model": state.model_name, "choices": choices,
                         "usage": _usage(finals, req.n)})


async def _completion_stream(state: ServeState, streams: list[RequestStream], request_id: str,
                             include_usage: bool, logprobs: int | None,
                             choices_per_prompt: int) -> AsyncIterator[str]:
    created = int(time.time())
    sent_logprobs = [0] * len(streams)
    finals: list[RequestOutput | None] = [None] * len(streams)
    try:
        async with aclosing(_merged(streams, state.drain)) as outputs:
            async for index, out in outputs:
                completion = out.outputs[0]
                if out.finished:
                    finals[index] = out
                elif not out.delta_text and logprobs is None:
                    continue  # text held back (partial character or possible stop string)
                chunk_logprobs = _completion_logprobs(out, sent_logprobs[index], logprobs)
                sent_logprobs[index] = len(completion.token_ids)
                chunk = {"id": request_id, "object": "text_completion", "created": created,
                         "model": state.model_name,
                         "choices": [{"index": index, "text": out.delta_text,
                                      "logprobs": chunk_logprobs,
                                      "finish_reason": completion.finish_reason,
                                      "stop_reason": completion.stop_reason}]}
                if include_usage:
                    chunk["usage"] = None
                yield _sse(chunk)
        if include_usage:
            yield _sse({"id": request_id, "object": "text_completion", "created": created,
                        "model": state.model_name, "choices": [],
                        "usage": _usage(finals, choices_per_prompt)})
    except Exception as exc:  # every stream ends with an error event and [DONE], never cut
        yield sse_error(stream_error(exc))
    yield "data: [DONE]\n\n"


# ---- /v1/chat/completions ----------------------------------------------------------------
async def create_chat_completion(state: ServeState, req: ChatCompletionRequest, raw: Request):
    check_model(state, req.model)
    check_engine(state)
    check_unsupported(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    check_choice_count(state, req.n, "n")
    tools = plan_tools(req, getattr(state.client.tokenizer, "chat_template", None),
                       state.tool_call_parser)
    structured, field = structured_spec(req)
    if tools.constraint is not None:
        if structured is not None:
            raise OpenAIError(400, f"tool_choice {req.tool_choice!r} and {field} both constrain the "
                                   "output; give one", param="tool_choice")
        structured, field = tools.constraint, "tools"
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(req, max_tokens, logprobs, structured)  # bad values fail early
    await check_constraint(state, params, field)
    state.metrics.observe_request_params(req.n, max_tokens)
    try:
        _, ids = await state.client.encode_async(messages=[m.for_template() for m in req.messages],
                                                 tools=tools.template_tools)
    except ValueError as exc:
        raise bad_prompt(exc, "messages") from None
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    choices = choice_params(params)
    prepared = [prepare(state, ids, choice, request_id if len(choices) == 1 else f"{request_id}-{i}",
                        max_tokens is not None, "messages") for i, choice in enumerate(choices)]
    streams = submit(state, prepared)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return EventStreamResponse(_chat_stream(state, streams, request_id, include_usage,
                                                logprobs, tools.fmt, req.parallel_tool_calls), streams)
    finals = await _run_to_end(streams, raw, state.drain)
    choices = []
    for i, out in enumerate(finals):
        completion = out.outputs[0]
        message, called = {"role": "assistant", "content": completion.text}, False
        if tools.fmt is not None:
            message, called = tool_call_message(tools.fmt, completion.text, req.parallel_tool_calls)
        choices.append({"index": i, "message": message, "logprobs": _chat_logprobs(out, 0, logprobs),
                        "finish_reason": "tool_calls" if called else completion.finish_reason,
                        "stop_reason": completion.stop_reason})
    return JSONResponse({"id": request_id, "object": "chat.completion",
                         "created": int(time.time()), "model": state.model_name,
                         "choices": choices, "usage": _usage(finals, len(finals))})


async def _chat_stream(state: ServeState, streams: list[RequestStream], request_id: str,
                       include_usage: bool, logprobs: int | None,
                       tool_format: ToolCallFormat | None = None,
                       parallel_tool_calls: bool = True) -> AsyncIterator[str]:
    created = int(time.time())
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created,
            "model": state.model_name}

    def chunk(index: int, delta: dict, finish_reason=None, chunk_logprobs=None,
              stop_reason=None) -> str:
        body = {**base, "choices": [{"index": index, "delta": delta, "logprobs": chunk_logprobs,
                                     "finish_reason": finish_reason,
                                     "stop_reason": stop_reason}]}
        if include_usage:
            body["usage"] = None
        return _sse(body)

    sent_logprobs = [0] * len(streams)
    finals: list[RequestOutput | None] = [None] * len(streams)
    # With tools, text goes through a parser that turns calls into tool_calls deltas.
    tool_streams = [ToolCallStream(tool_format, parallel_tool_calls) if tool_format else None
                    for _ in streams]
    try:
        async with aclosing(_merged(streams, state.drain)) as outputs:
            for index in range(len(streams)):
                yield chunk(index, {"role": "assistant", "content": ""})
            async for index, out in outputs:
                completion = out.outputs[0]
                tool_stream = tool_streams[index]
                if out.finished:
                    finals[index] = out
                elif not out.delta_text and logprobs is None:
                    continue
                chunk_logprobs = _chat_logprobs(out, sent_logprobs[index], logprobs)
                sent_logprobs[index] = len(completion.token_ids)
                finish = completion.finish_reason
                if tool_stream is None:
                    delta = {"content": out.delta_text} if out.delta_text else {}
                else:
                    content, calls = tool_stream.update(completion.text, out.finished)
                    delta = {"content": content} if content else {}
                    if calls:
                        delta["tool_calls"] = calls
                    if out.finished and tool_stream.called:
                        finish = "tool_calls"
                yield chunk(index, delta, finish, chunk_logprobs, completion.stop_reason)
        if include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(finals, len(finals))})
    except Exception as exc:  # every stream ends with an error event and [DONE], never cut
        yield sse_error(stream_error(exc))
    yield "data: [DONE]\n\n"


# ---- running requests ----------------------------------------------------------------------
async def _final_output(stream: RequestStream) -> RequestOutput:
    last = None
    try:
        async for out in stream:
            last = out
    finally:
        stream.cancel()
    return last


async def _run_to_end(streams: list[RequestStream], raw: Request, drain: Drain) -> list[RequestOutput]:
    """Run to completion; if the HTTP client goes away first, abort (frees the blocks)."""
    work = asyncio.ensure_future(asyncio.gather(*(_final_output(s) for s in streams)))
    watchers = {asyncio.ensure_future(_wait_disconnect(raw)), asyncio.ensure_future(drain.expired.wait())}
    try:
        await asyncio.wait({work, *watchers}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
        finished = work.done()
        if not finished:
            work.cancel()
        for stream in streams:
            stream.cancel()
    if not finished:
        if drain.expired.is_set():
            raise stream_error(ServerShuttingDown())
        raise OpenAIError(400, "the client disconnected", code="client_disconnected")
    try:
        return work.result()
    except Exception as exc:
        raise stream_error(exc) from None


def stream_error(exc: Exception) -> OpenAIError:
    """What a request that failed while running is told."""
    match exc:
        case EngineDeadError() | EngineNotReadyError():
            return OpenAIError(503, f"the engine stopped: {exc}", code="engine_unavailable",
                               retry_after=ENGINE_START_RETRY_S)
        case RequestFailedError():
            return OpenAIError(500, f"the engine could not complete this request: {exc}",
                               code="request_failed")
        case ServerShuttingDown():
            return OpenAIError(503, "the server is shutting down", code="server_shutting_down")
        case OpenAIError():
            return exc
        case ValueError():
            return OpenAIError(400, str(exc))
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}")


def bad_prompt(exc: ValueError, param: str) -> OpenAIError:
    error = OpenAIError(400, str(exc), param=param)
    if "max_model_len" in error.message:
        error.code = "context_length_exceeded"
    return error


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def _merged(streams: list[RequestStream],
                  drain: Drain) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from one or several requests, as they arrive; raises
    ServerShuttingDown once the grace period after SIGTERM is over."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:
            queue.put_nowait(exc)

    async def cut() -> None:
        await drain.expired.wait()
        queue.put_nowait(ServerShuttingDown())

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    tasks.append(asyncio.ensure_future(cut()))
    remaining = len(streams)
    try:
        while remaining:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item[1].finished:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()


# ---- response pieces -------------------------------------------------------------------------
def _prompt_list(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    return list(prompt)


def _usage(finals: list[RequestOutput | None], choices_per_prompt: int) -> dict:
    # A prompt counts once however many choices it has (OpenAI's usage).
    prompt = sum(len(o.prompt_token_ids) for o in finals[::choices_per_prompt] if o is not None)
    completion = sum(len(o.outputs[0].token_ids) for o in finals if o is not None)
    cached = sum(o.num_cached_tokens for o in finals if o is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}}


def _sse(body: dict) -> str:
    # ASCII-escaped: clients that split lines on U+2028 or NEL must not cut an event in two
    return f"data: {json.dumps(body)}\n\n"


def _new_logprobs(out: RequestOutput, start: int) -> list[tuple[int, dict[int, Logprob]]]:
    completion = out.outputs[0]
    end = len(completion.token_ids)  # the shared logprobs list may already be longer
    entries = (completion.logprobs or [])[start:end]
    return list(zip(completion.token_ids[start:end], entries, strict=False))


def _top(entry: dict[int, Logprob], num: int) -> list[Logprob]:
    return sorted(entry.values(), key=lambda lp: lp.logprob, reverse=True)[:num]


def _completion_logprobs(out: RequestOutput, start: int, num: int | None) -> dict | None:
    if num is None:
        return None
    offset = len(out.outputs[0].text) - len(out.delta_text) if start else 0
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in _new_logprobs(out, start):
        sampled = entry[token_id]
        text = sampled.decoded or ""
        tokens.append(text)
        token_logprobs.append(sampled.logprob)
        top = {lp.decoded or "": lp.logprob for lp in _top(entry, num)}
        top.setdefault(text, sampled.logprob)
        top_logprobs.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}


def _chat_logprobs(out: RequestOutput, start: int, num: int | None) -> dict | None:
    if num is None:
        return None

    def item(lp: Logprob) -> dict:
        text = lp.decoded or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**item(entry[token_id]), "top_logprobs": [item(lp) for lp in _top(entry, num)]}
               for token_id, entry in _new_logprobs(out, start)]
    return {"content": content}
