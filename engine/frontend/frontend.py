"""The front-end: everything between a caller's request and the core's token ids, in one place.

Tokenise (chat template for conversations), check the request against the engine's
limits and the ids in use (once on this side; the core checks again on receipt), fan its
n choices out to n engine requests (parent_request.py), register them with the output
processor (detokeniser, stop strings) and send them to the core through a `CoreClient`. On
the way back, turn core outputs into the caller's `RequestOutput`s and stop in the core
what a stop string finished. The offline `LLMEngine` and the async `AsyncLLM` both work
through this class, over the in-process and the subprocess core client respectively.
"""

import time
from collections.abc import Callable
from functools import lru_cache

from kvdeck.engine.frontend.chat import check_unicode, render_chat
from kvdeck.engine.frontend.output_processor import OutputProcessor
from kvdeck.engine.frontend.parent_request import ParentRequest
from kvdeck.engine.frontend.tokenizer import encode_prompt, max_chars_per_token, tokenizer_eos_ids
from kvdeck.engine.grammar.compile import check_grammar
from kvdeck.engine.types.core_client import CoreClient
from kvdeck.engine.types.errors import GrammarError, PromptError
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.prompts import PromptType, parse_prompt
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams
from kvdeck.engine.types.wire import EngineCoreOutput, EngineCoreRequest, RequestStatus

Prompt = PromptType
# The caller's last word on a request, after the engine's checks and before anything is sent.
Admit = Callable[[list[int], SamplingParams], None]
# Normalisation can fold a few characters into one (combining marks), so the character
# pre-check only refuses text this many times longer than the longest possible prompt.
CHAR_CHECK_MARGIN = 4


class Frontend:
    """`observe`: called with every engine request's own output (one choice, its engine
    id), for metrics; callers get the outputs of their requests instead."""

    def __init__(self, tokenizer, core_client: CoreClient, limits: RequestLimits,
                 observe: Callable[[RequestOutput], None] | None = None) -> None:
        self.tokenizer = tokenizer
        self.core_client = core_client
        self.limits = limits
        self.observe = observe
        self.eos_token_ids = tokenizer_eos_ids(tokenizer)
        self.output_processor = OutputProcessor(tokenizer)
        self.requests: dict[str, ParentRequest] = {}  # by the caller's request id
        # engine id -> (request, choice index, whether it is the request's only choice)
        self._choices: dict[str, tuple[ParentRequest, int, bool]] = {}
        self._num_fanned_out = 0  # requests in `requests` of more than one choice
        chars = max_chars_per_token(tokenizer)
        self.max_prompt_chars = limits.max_model_len * chars * CHAR_CHECK_MARGIN if chars else None

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    @property
    def num_waiting(self) -> int:
        """Engine requests (choices) sent that have no token yet."""
        return sum(1 for state in self.output_processor.states.values() if not state.num_tokens)

    # ---- in ------------------------------------------------------------------------
    def encode(self, prompt: Prompt | None = None, messages: list[dict] | None = None,
               tools: list[dict] | None = None,
               template_kwargs: dict | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as add_request would send them; PromptError on bad input.
        Text far beyond what max_model_len tokens can hold is refused before tokenising."""
        try:
            if messages is not None:
                if prompt is not None:
                    raise ValueError("give either prompt or messages, not both")
                if isinstance(messages, list):
                    self._check_length(sum(len(m.get("content") or "") for m in messages
                                           if isinstance(m, dict) and isinstance(m.get("content"), str)),
                                       "messages")
                return None, render_chat(self.tokenizer, messages, tools, template_kwargs)
            if template_kwargs is not None:
                raise ValueError("chat_template_kwargs go with messages, not a prompt")
            if prompt is None:
                raise ValueError("prompt or messages is required")
            prompt = parse_prompt(prompt)  # a TextPrompt or TokensPrompt dict: its text or ids
            if isinstance(prompt, str):
                self._check_length(len(prompt), "prompt")
            return encode_prompt(self.tokenizer, prompt)
        except PromptError:
            raise
        except ValueError as exc:  # the template's, the tokenizer's and our own
            raise PromptError(str(exc)) from exc

    def check_text(self, text: str, what: str) -> None:
        """The checks a text passes before it is tokenised: length, valid Unicode."""
        self._check_length(len(text), what)
        check_unicode(text, what)

    def _check_length(self, num_chars: int, what: str) -> None:
        if self.max_prompt_chars is not None and num_chars > self.max_prompt_chars:
            raise PromptError(f"{what} has {num_chars} characters, far more than max_model_len "
                              f"({self.limits.max_model_len} tokens) can hold")

    def add_request(self, request_id: str, prompt: Prompt | None, params: SamplingParams, *,
                    messages: list[dict] | None = None, arrival_time: float | None = None,
                    lora_request: LoRARequest | None = None,
                    chat_template_kwargs: dict | None = None) -> None:
        """Tokenise, check and send one request; ValueError (nothing sent) on bad input."""
        prompt_text, prompt_ids = self.encode(prompt, messages, template_kwargs=chat_template_kwargs)
        self.add_encoded(request_id, prompt_text, prompt_ids, params, arrival_time=arrival_time,
                         lora_request=lora_request)

    def add_encoded(self, request_id: str, prompt_text: str | None, prompt_ids: list[int],
                    params: SamplingParams, *, arrival_time: float | None = None,
                    admit: Admit | None = None, lora_request: LoRARequest | None = None) -> None:
        """Check a request already tokenised (by `encode`, perhaps off the loop) and send its
        choices; ValueError, with nothing sent, on bad input. `admit(prompt_ids, params)`
        runs after these checks, right before sending (a server's queue limit): it may set
        params.max_tokens, or raise to refuse. `lora_request`: the adapter its choices run
        under (the caller checked that LoRA is on)."""
        self.limits.check(prompt_ids, params)
        request = ParentRequest.of(request_id, params)
        if request_id in self.requests or any(c in self._choices for c in request.child_ids):
            raise ValueError(f"request_id {request_id!r} is already in use")
        if params.structured_outputs is not None:
            checked_grammar(params.structured_outputs)
        if admit is not None:
            admit(prompt_ids, params)
        arrival_time = arrival_time or time.time()
        registered: list[str] = []
        num_sent = 0
        try:
            for index, child_id in enumerate(request.child_ids):
                child_params = request.child_params(index)
                self.output_processor.add_request(child_id, prompt_text, prompt_ids, child_params,
                                                  arrival_time)
                self._choices[child_id] = (request, index, len(request.child_ids) == 1)
                registered.append(child_id)
                self.core_client.add_request(EngineCoreRequest(child_id, prompt_ids, child_params,
                                                               arrival_time, list(self.eos_token_ids),
                                                               lora_request))
                num_sent += 1
        except BaseException:  # all choices or none
            if num_sent:
                self.core_client.abort_requests(registered[:num_sent])
            for child_id in registered:
                self.output_processor.abort(child_id)
                del self._choices[child_id]
            raise
        self.requests[request_id] = request
        self._num_fanned_out += len(request.child_ids) > 1

    # ---- ending early -------------------------------------------------------------------
    def abort(self, request_ids: list[str], tell_core: bool = True,
              error: str | None = None) -> list[RequestOutput]:
        """Finish requests now, every choice of each; their final outputs ("abort", or "error"
        with `error`). `tell_core`: the core frees their blocks (False where it lost them or
        is gone)."""
        child_ids = [child_id for request_id in request_ids if request_id in self.requests
                     for child_id in self.requests[request_id].child_ids if child_id in self._choices]
        if child_ids and tell_core:
            self.core_client.abort_requests(child_ids)
        return self._to_callers([out for child_id in child_ids
                                 if (out := self.output_processor.abort(child_id, error)) is not None])

    def refused(self, engine_request_id: str) -> str | None:
        """The core refused one of a request's choices: end the whole request here and its
        other choices in the core, telling nobody (the caller gets the refusal). Its id."""
        entry = self._choices.get(engine_request_id)
        if entry is None:
            return None
        request = entry[0]
        others = [c for c in request.child_ids if c != engine_request_id and c in self._choices]
        if others:
            self.core_client.abort_requests(others)
        for child_id in request.child_ids:
            if self._choices.pop(child_id, None) is not None:
                self.output_processor.abort(child_id)
        self._forget(request)
        return request.request_id

    # ---- out ----------------------------------------------------------------------------
    def process_outputs(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        """The callers' outputs for a step's core outputs."""
        outputs, stopped, failed = self.output_processor.process(core_outputs)
        if stopped:  # stop strings matched here: free their blocks in the core
            self.core_client.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if failed:  # their text could not be made: end them in the core too
            self.core_client.abort_requests(failed, RequestStatus.FINISHED_ERROR)
        return self._to_callers(outputs)

    def _to_callers(self, engine_outputs: list[RequestOutput]) -> list[RequestOutput]:
        outputs = []
        observe, choices = self.observe, self._choices
        # While every request has one choice, a running one's output is its caller's as it is.
        all_single = not self._num_fanned_out
        for out in engine_outputs:
            if observe is not None:
                observe(out)
            if all_single and not out.finished:
                outputs.append(out)
                continue
            request, index, only = choices[out.request_id]
            if only and not out.finished:  # request.output's, inlined
                outputs.append(out)
                continue
            if out.finished:
                del choices[out.request_id]
            outputs.append(request.output(index, out))
            if out.finished and request.finished:
                self._forget(request)
        return outputs

    def _forget(self, request: ParentRequest) -> None:
        del self.requests[request.request_id]
        self._num_fanned_out -= len(request.child_ids) > 1


@lru_cache(maxsize=256)
def checked_grammar(spec: StructuredOutputsParams) -> None:
    """check_grammar, remembered per spec (a spec checked off the event loop, by the async
    engine, is not checked again on it); GrammarError quoting the grammar library."""
    try:
        check_grammar(spec)
    except ValueError as exc:
        raise GrammarError(str(exc)) from None
