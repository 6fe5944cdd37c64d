"""The front-end: everything between a caller's text and the core's token ids, in one place.

Tokenise (chat template for conversations), check the request against the engine's
limits, register it with the output processor (detokeniser, stop strings), send it to the
core through a `CoreClient`; on the way back, turn core outputs into `RequestOutput`s and
stop in the core what a stop string finished. The offline `LLMEngine` and the async
`EngineClient` both work through this class, over the in-process and the subprocess
core client respectively.
"""

import time
from functools import lru_cache

from kvdeck.engine.frontend.chat import check_unicode, render_chat
from kvdeck.engine.frontend.output_processor import OutputProcessor
from kvdeck.engine.frontend.tokenizer import encode_prompt, max_chars_per_token, tokenizer_eos_ids
from kvdeck.engine.grammar.compile import check_grammar
from kvdeck.engine.types.core_client import CoreClient
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.wire import EngineCoreOutput, EngineCoreRequest, RequestStatus

Prompt = str | list[int]
# Normalisation can fold a few characters into one (combining marks), so the character
# pre-check only refuses text this many times longer than the longest possible prompt.
CHAR_CHECK_MARGIN = 4


class Frontend:
    def __init__(self, tokenizer, client: CoreClient, limits: RequestLimits) -> None:
        self.tokenizer = tokenizer
        self.client = client
        self.limits = limits
        self.eos_token_ids = tokenizer_eos_ids(tokenizer)
        self.output_processor = OutputProcessor(tokenizer)
        chars = max_chars_per_token(tokenizer)
        self.max_prompt_chars = limits.max_model_len * chars * CHAR_CHECK_MARGIN if chars else None

    @property
    def num_unfinished(self) -> int:
        return len(self.output_processor.states)

    def encode(self, prompt: Prompt | None = None, messages: list[dict] | None = None,
               tools: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as add_request would send them; ValueError on bad input.
        Text far beyond what max_model_len tokens can hold is refused before tokenising."""
        if messages is not None:
            if prompt is not None:
                raise ValueError("give either prompt or messages, not both")
            if isinstance(messages, list):
                self._check_length(sum(len(m.get("content") or "") for m in messages
                                       if isinstance(m, dict) and isinstance(m.get("content"), str)),
                                   "messages")
            return None, render_chat(self.tokenizer, messages, tools)
        if prompt is None:
            raise ValueError("prompt or messages is required")
        if isinstance(prompt, str):
            self._check_length(len(prompt), "prompt")
        return encode_prompt(self.tokenizer, prompt)

    def check_text(self, text: str, what: str) -> None:
        """The checks a text passes before it is tokenised: length, valid Unicode."""
        self._check_length(len(text), what)
        check_unicode(text, what)

    def _check_length(self, num_chars: int, what: str) -> None:
        if self.max_prompt_chars is not None and num_chars > self.max_prompt_chars:
            raise ValueError(f"{what} has {num_chars} characters, far more than max_model_len "
                             f"({self.limits.max_model_len} tokens) can hold")

    def add_request(self, request_id: str, prompt: Prompt | None, params: SamplingParams,
                    messages: list[dict] | None = None, arrival_time: float | None = None) -> None:
        """Tokenise, check and send one request; ValueError (nothing queued) on bad input."""
        prompt_text, prompt_ids = self.encode(prompt, messages)
        self.add_encoded(request_id, prompt_text, prompt_ids, params, arrival_time)

    def add_encoded(self, request_id: str, prompt_text: str | None, prompt_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None) -> None:
        """Check and send a request already tokenised (by `encode`, perhaps off the loop)."""
        if self.output_processor.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        self.limits.check(prompt_ids, params)
        if params.structured_outputs is not None:
            checked_grammar(params.structured_outputs)
        arrival_time = arrival_time or time.time()
        self.output_processor.add_request(request_id, prompt_text, prompt_ids, params, arrival_time)
        try:
            self.client.add_request(EngineCoreRequest(request_id, prompt_ids, params, arrival_time,
                                                      list(self.eos_token_ids)))
        except BaseException:
            self.output_processor.abort(request_id)
            raise

    def abort(self, request_ids: list[str], tell_core: bool = True,
              error: str | None = None) -> list[RequestOutput]:
        """Finish requests now; their final outputs ("abort", or "error" with `error`).
        `tell_core`: the core frees their blocks (False where the core refused or lost them,
        or is gone)."""
        if request_ids and tell_core:
            self.client.abort_requests(request_ids)
        return [out for rid in request_ids
                if (out := self.output_processor.abort(rid, error)) is not None]

    def process_outputs(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        outputs, stopped, failed = self.output_processor.process(core_outputs)
        if stopped:  # stop strings matched here: free their blocks in the core
            self.client.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if failed:  # their text could not be made: end them in the core too
            self.client.abort_requests(failed, RequestStatus.FINISHED_ERROR)
        return outputs


@lru_cache(maxsize=256)
def checked_grammar(spec) -> None:
    """check_grammar, remembered per spec (a spec checked off the event loop, by the async
    client, is not checked again on it)."""
    check_grammar(spec)
