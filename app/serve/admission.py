"""Admission for /v1/completions and /v1/chat/completions: a request is checked completely
(model, engine state, sampling values, context length, queue room) before anything is
queued, so a bad request never disturbs the others; what can never succeed is a 400, what
may succeed later a 429 or 503 with Retry-After."""

from dataclasses import dataclass

from kvdeck.app.serve.errors import OpenAIError, bad_request
from kvdeck.app.serve.metrics import EngineMetrics
from kvdeck.app.serve.protocol import SamplingRequest
from kvdeck.app.serve.shutdown import Drain
from kvdeck.app.serve.streaming import ENGINE_START_RETRY_S, stream_error
from kvdeck.engine.api.async_client import (
    EngineClient,
    EngineDeadError,
    EngineNotReadyError,
    RequestStream,
)
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams

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



@dataclass(slots=True)
class PreparedPrompt:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams



def check_model(state: ServeState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                               f"{state.model_name!r}", param="model", code="model_not_found")



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



def bad_prompt(exc: ValueError, param: str) -> OpenAIError:
    error = OpenAIError(400, str(exc), param=param)
    if "max_model_len" in error.message:
        error.code = "context_length_exceeded"
    return error
