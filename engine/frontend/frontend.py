"""The front-end: everything between a caller's text and the core's token ids, in one place.

Tokenise (chat template for conversations), check the request against the engine's
limits, register it with the output processor (detokeniser, stop strings), send it to the
core through a `CoreClient`; on the way back, turn core outputs into `RequestOutput`s and
stop in the core what a stop string finished. The offline `LLMEngine` and the async
`EngineClient` both work through this class, over the in-process and the subprocess
core client respectively.
"""

import time

from kvdeck.engine.frontend.output_processor import OutputProcessor
from kvdeck.engine.frontend.tokenizer import apply_chat_template, encode_prompt, tokenizer_eos_ids
from kvdeck.engine.types.core_client import CoreClient
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.wire import EngineCoreOutput, EngineCoreRequest, RequestStatus

Prompt = str | list[int]


class Frontend:
    def __init__(self, tokenizer, client: CoreClient, limits: RequestLimits) -> None:
        self.tokenizer = tokenizer
        self.client = client
        self.limits = limits
        self.eos_token_ids = tokenizer_eos_ids(tokenizer)
        self.output_processor = OutputProcessor(tokenizer)

    @property
    def num_unfinished(self) -> int:
        return len(self.output_processor.states)

    def encode(self, prompt: Prompt | None = None,
               messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """(prompt text, token ids) as add_request would send them; ValueError on bad input."""
        if messages is not None:
            if prompt is not None:
                raise ValueError("give either prompt or messages, not both")
            return None, apply_chat_template(self.tokenizer, messages)
        if prompt is None:
            raise ValueError("prompt or messages is required")
        return encode_prompt(self.tokenizer, prompt)

    def add_request(self, request_id: str, prompt: Prompt | None, params: SamplingParams,
                    messages: list[dict] | None = None, arrival_time: float | None = None) -> None:
        """Tokenise, check and send one request; ValueError (nothing queued) on bad input."""
        if self.output_processor.has_request(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        prompt_text, prompt_ids = self.encode(prompt, messages)
        self.limits.check(prompt_ids, params)
        arrival_time = arrival_time or time.time()
        self.output_processor.add_request(request_id, prompt_text, prompt_ids, params, arrival_time)
        try:
            self.client.add_request(EngineCoreRequest(request_id, prompt_ids, params, arrival_time,
                                                      list(self.eos_token_ids)))
        except BaseException:
            self.output_processor.abort(request_id)
            raise

    def abort(self, request_ids: list[str], tell_core: bool = True) -> list[RequestOutput]:
        """Finish requests now; their final outputs. `tell_core`: the core frees their
        blocks (False where the core refused or lost them, or is gone)."""
        if request_ids and tell_core:
            self.client.abort_requests(request_ids)
        return [out for rid in request_ids if (out := self.output_processor.abort(rid)) is not None]

    def process_outputs(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        outputs, stopped = self.output_processor.process(core_outputs)
        if stopped:  # stop strings matched here: free their blocks in the core
            self.client.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs
