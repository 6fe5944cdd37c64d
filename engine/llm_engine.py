"""LLMEngine: the synchronous step API over an in-process EngineCore.

Client-side work (tokenising, detokenising, stop strings) happens here, the core sees
token ids only. The async client of the background engine process does the same work
around the same core.
"""

import itertools
import time

from engine.config import EngineConfig
from engine.core import EngineCore, EngineCoreRequest
from engine.model_runner import ProgressCallback
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.request import RequestStatus
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats
from engine.tokenizer import apply_chat_template, encode_prompt, load_tokenizer


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: ProgressCallback | None = None) -> None:
        self.config = config
        self.core = EngineCore(config, progress)
        self.tokenizer = load_tokenizer(
            self.core.model_dir, config.tokenizer, required=config.load_format != "dummy"
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.tokenizer_eos = [eos] if isinstance(eos, int) else []

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def add_request(
        self,
        request_id: str | None,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> str:
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else self.next_request_id()
        prompt_text, prompt_ids = encode_prompt(self.tokenizer, prompt)
        arrival_time = arrival_time or time.time()
        self.core.add_request(
            EngineCoreRequest(request_id, prompt_ids, params, arrival_time, self.tokenizer_eos)
        )
        self.output_processor.add_request(request_id, prompt_text, prompt_ids, params, arrival_time)
        return request_id

    def add_chat_request(self, request_id: str | None, messages: list[dict],
                         params: SamplingParams | None = None) -> str:
        return self.add_request(request_id, apply_chat_template(self.tokenizer, messages), params)

    def abort_request(self, request_ids: str | list[str]) -> list[RequestOutput]:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.core.abort_requests(ids)
        return [out for rid in ids if (out := self.output_processor.abort(rid)) is not None]

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        outputs, stopped = self.output_processor.process(self.core.step())
        if stopped:
            self.core.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs

    def stats(self) -> EngineStats:
        return self.core.stats()
