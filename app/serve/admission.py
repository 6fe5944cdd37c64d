"""Admission for /v1/completions and /v1/chat/completions: what the HTTP server adds to the
engine's own checks. Before the engine sees a request: the model, the engine's state,
unsupported fields, choices beyond what the queue could ever hold, the sampling values.
Then one call hands each prompt to the engine, which tokenises it and checks it (prompt,
context length, grammar, request ids) and, with no await in between, asks `_admit` for the
rest: OpenAI's max_tokens rule and room in the queue. What can never succeed is a 400, what
may succeed later a 429 or 503 with Retry-After; the engine's refusals become OpenAI errors
here. A bad request never disturbs the others.
"""

from dataclasses import dataclass, replace
from functools import partial

from kvdeck.app.serve.errors import OpenAIError, bad_request
from kvdeck.app.serve.lora_adapters import AdapterRegistry
from kvdeck.app.serve.metrics import EngineMetrics
from kvdeck.app.serve.protocol import SamplingRequest
from kvdeck.app.serve.shutdown import Drain
from kvdeck.app.serve.streaming import ENGINE_START_RETRY_S, stream_error
from kvdeck.engine.api.async_llm import (
    AsyncLLM,
    EngineDeadError,
    EngineNotReadyError,
    RequestStream,
)
from kvdeck.engine.frontend.chat import check_template_kwargs
from kvdeck.engine.frontend.reasoning import ReasoningFormat
from kvdeck.engine.types.errors import GrammarError, PromptError
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "seed")
_PARAM_NAMES = frozenset(_SAMPLING_FIELDS + (
    "n", "max_tokens", "min_tokens", "stop", "stop_token_ids", "logprobs", "top_logprobs",
    "prompt", "messages", "max_completion_tokens", "prompt_logprobs", "logit_bias"))


@dataclass(slots=True)
class ServeState:
    engine: AsyncLLM
    metrics: EngineMetrics
    model_name: str  # what /v1/models lists and requests must name
    max_queue_len: int
    drain: Drain
    restart_delay: float | None = 1.0  # None: a dead engine stays down
    tool_call_parser: str | None = None  # the tool-call format, when not read from the template
    model_aliases: frozenset[str] = frozenset()  # other names of the model requests may give
    adapters: AdapterRegistry | None = None  # LoRA adapters served by name (lora_adapters.py)
    reasoning: ReasoningFormat | None = None  # --reasoning-parser: chat replies' thinking apart



@dataclass(slots=True, frozen=True)
class Fields:
    """The request's fields that the engine's refusals are about."""

    prompt: str = "prompt"  # or "messages"
    constraint: str | None = None  # the field that gave the output constraint
    max_tokens_given: bool = False  # max_tokens was in the request (not a default)



def check_model(state: ServeState, model: str | None) -> LoRARequest | None:
    """404 unless `model` is None, the served name or one of its aliases (served_name.py), or
    a LoRA adapter's name (then its LoRARequest)."""
    if model is None or model == state.model_name or model in state.model_aliases:
        return None
    lora = state.adapters.get(model) if state.adapters is not None else None
    if lora is not None:
        return lora
    adapters = [a.name for a in state.adapters.served()] if state.adapters is not None else []
    also = f" and the LoRA adapters {', '.join(map(repr, adapters))}" if adapters else ""
    raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{state.model_name!r}{also}", param="model", code="model_not_found")



def check_engine(state: ServeState) -> None:
    if state.drain.draining:
        raise OpenAIError(503, "the server is shutting down", code="server_shutting_down")
    health = state.engine.health()
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
    """Before the engine sees it: a request with more choices (engine requests) than the
    queue holds can never be queued (400, not 429)."""
    if num_choices > state.max_queue_len:
        raise OpenAIError(400, f"this request needs {num_choices} engine requests (prompts x n); "
                               f"the queue holds {state.max_queue_len} (--max-queue-len)",
                          param=param, code="too_many_choices")



def check_queue(state: ServeState, num_new: int) -> None:
    waiting = state.engine.num_waiting
    if waiting + num_new > state.max_queue_len:
        raise OpenAIError(429, f"the queue is full ({waiting} requests waiting, "
                               f"--max-queue-len {state.max_queue_len}); retry later",
                          code="queue_full", retry_after=1)



def check_unsupported(req: SamplingRequest) -> None:
    if req.prompt_logprobs is not None and req.stream:  # vLLM's rule: they come in one piece
        raise OpenAIError(400, "prompt_logprobs is not available with stream: true",
                          param="prompt_logprobs")



def check_chat_template_kwargs(kwargs: dict | None) -> None:
    """400 naming chat_template_kwargs for variables the template may not be given (the
    engine checks again when it renders)."""
    try:
        check_template_kwargs(kwargs)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="chat_template_kwargs") from None



def sampling_params(req: SamplingRequest, max_tokens: int | None, logprobs: int | None,
                    structured: StructuredOutputsParams | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    values = {name: getattr(req, name) for name in _SAMPLING_FIELDS
              if getattr(req, name) is not None}
    try:
        return SamplingParams(
            n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=req.stop or [],
            stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias={int(token): bias for token, bias in req.logit_bias.items()} or None
            if req.logit_bias is not None else None,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            structured_outputs=structured, **values)
    except ValueError as exc:
        raise bad_request(exc, _PARAM_NAMES) from None



async def submit(state: ServeState, prompts: list[tuple[str, object]], params: SamplingParams,
                 fields: Fields, messages: list[dict] | None = None,
                 tools: list[dict] | None = None,
                 lora_request: LoRARequest | None = None,
                 chat_template_kwargs: dict | None = None) -> list[RequestStream]:
    """Hand each (request id, prompt) to the engine, one call each, all or none; a stream
    each, its outputs by choice index. `lora_request`: the adapter they run under."""
    streams: list[RequestStream] = []
    tracked: list[str] = []  # engine request ids running under the adapter
    try:
        for request_id, prompt in prompts:
            if lora_request is not None and state.adapters is not None:
                tracked += state.adapters.track(request_id, params, lora_request)
            streams.append(await state.engine.add_request(
                request_id, prompt, replace(params), messages=messages, tools=tools,
                admit=partial(_admit, state, fields.max_tokens_given), lora_request=lora_request,
                chat_template_kwargs=chat_template_kwargs))
    except BaseException as exc:
        for stream in streams:
            stream.cancel()
        if tracked and state.adapters is not None:
            state.adapters.untrack(tracked[len(streams) * params.n:])  # the ones never queued
        if not isinstance(exc, GrammarError):
            _observe_constrained(state, params)  # the engine checks the grammar first
        error = _refusal(exc, fields)
        if error is exc:
            raise
        raise error from None
    _observe_constrained(state, params)
    return streams



def _admit(state: ServeState, max_tokens_given: bool, prompt_ids: list[int],
           params: SamplingParams) -> None:
    """Called by the engine once the prompt passed its checks, right before it is queued."""
    room = state.engine.max_model_len - len(prompt_ids)
    if params.max_tokens is None:
        params.max_tokens = room
    elif max_tokens_given and params.max_tokens > room:
        raise OpenAIError(
            400, f"this model's maximum context length is {state.engine.max_model_len} tokens; you "
                 f"asked for {len(prompt_ids) + params.max_tokens} ({len(prompt_ids)} in the prompt, "
                 f"{params.max_tokens} to generate): shorten the prompt or lower max_tokens",
            param="max_tokens", code="context_length_exceeded")
    else:
        params.max_tokens = min(params.max_tokens, room)
    check_queue(state, params.n)



def _observe_constrained(state: ServeState, params: SamplingParams) -> None:
    if params.structured_outputs is not None:
        state.metrics.observe_constrained()



def _refusal(exc: BaseException, fields: Fields) -> BaseException:
    """What the client is told when the engine refuses a request."""
    match exc:
        case GrammarError():
            return OpenAIError(400, str(exc), param=fields.constraint, code="invalid_grammar")
        case PromptError():
            return bad_prompt(exc, fields.prompt)
        case ValueError():
            error = bad_request(exc, _PARAM_NAMES)
            if error.param == "prompt":
                error.param = fields.prompt
            if "max_model_len" in error.message:
                error.code = "context_length_exceeded"
            return error
        case EngineDeadError() | EngineNotReadyError():
            return stream_error(exc)
    return exc



def bad_prompt(exc: ValueError, param: str) -> OpenAIError:
    error = OpenAIError(400, str(exc), param=param)
    if "max_model_len" in error.message:
        error.code = "context_length_exceeded"
    return error
