"""LLMEngine: the synchronous step API, the front-end over an in-process EngineCore.

`add_request` / `step` / `abort_request` as vLLM's LLMEngine; the offline `LLM` drives it.
`step()` returns the requests' outputs, one per choice that moved (`outputs[0].index` says
which). The async `AsyncLLM` runs the same front-end over a core in its own process.
"""

import itertools
import time
from dataclasses import replace

from kvdeck.engine.core_client.inproc import InprocCoreClient
from kvdeck.engine.frontend.frontend import Frontend, Prompt
from kvdeck.engine.frontend.tokenizer import load_tokenizer
from kvdeck.engine.runner.model_runner import ProgressCallback
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import LoRARequest, check_lora_request
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats, KVOccupancy, StepTimings
from kvdeck.engine.types.wire import EngineInfo

NOTHING_TO_RUN_WAIT_S = 0.001


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: ProgressCallback | None = None) -> None:
        self.config = config
        self.core_client = InprocCoreClient(config, progress)
        info = self.core_client.info
        try:
            self.tokenizer = load_tokenizer(info.model_dir, config.tokenizer,
                                            required=config.load_format != "dummy")
        except BaseException:
            self.core_client.shutdown()
            raise
        self.frontend = Frontend(self.tokenizer, self.core_client,
                                 RequestLimits(info.max_model_len, info.vocab_size))
        self._ids = itertools.count()
        self._frontend_s = 0.0  # turning core outputs into callers' outputs (step_timings)

    @property
    def core(self):
        """The EngineCore itself (tests and debugging look inside it)."""
        return self.core_client.core

    @property
    def info(self) -> EngineInfo:
        return self.core_client.info

    @property
    def max_model_len(self) -> int:
        return self.core_client.info.max_model_len

    @property
    def eos_token_ids(self) -> list[int]:
        """The ids that end a request unless it ignores EOS: the model's and the tokenizer's."""
        return sorted(self.core.default_eos_token_ids | set(self.frontend.eos_token_ids))

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def add_request(self, request_id: str | None, prompt: Prompt | None,
                    params: SamplingParams | None = None, arrival_time: float | None = None,
                    *, messages: list[dict] | None = None,
                    lora_request: LoRARequest | None = None,
                    chat_template_kwargs: dict | None = None) -> str:
        """Queue one request (its n choices); its id. `messages`: a conversation instead of a
        prompt (the chat template is applied); `lora_request`: the adapter it runs under.
        ValueError, with nothing queued, on bad input (a bad adapter included)."""
        check_lora_request(lora_request, self.config.enable_lora)
        request_id = request_id if request_id is not None else self.next_request_id()
        self.frontend.add_request(request_id, prompt, params or SamplingParams(), messages=messages,
                                  arrival_time=arrival_time, lora_request=lora_request,
                                  chat_template_kwargs=chat_template_kwargs)
        return request_id

    # ---- LoRA adapters (vLLM's LLMEngine names) -------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.core_client.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.core_client.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self.core_client.list_loras()

    def abort_request(self, request_ids: str | list[str]) -> list[RequestOutput]:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        return self.frontend.abort(ids)

    def has_unfinished_requests(self) -> bool:
        return self.core_client.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        steps_before = self.core.num_steps
        core_outputs = self.core_client.step()
        started = time.perf_counter()
        outputs = self.frontend.process_outputs(core_outputs)
        self._frontend_s += time.perf_counter() - started
        if not outputs and self.core.num_steps == steps_before and not self.core.step_in_flight:
            time.sleep(NOTHING_TO_RUN_WAIT_S)  # every waiting request is compiling its grammar
        return outputs

    def stats(self) -> EngineStats:
        return self.core_client.stats()

    # ---- for benchmarks -------------------------------------------------------------
    def occupancy(self) -> KVOccupancy:
        return self.core_client.occupancy()

    def step_timings(self) -> StepTimings:
        return replace(self.core_client.step_timings(), frontend_s=self._frontend_s)

    def reset_timings(self) -> None:
        self.core_client.reset_timings()
        self._frontend_s = 0.0

    def reset_prefix_cache(self) -> None:
        self.core_client.reset_prefix_cache()

    def shutdown(self) -> None:
        """Free the model and the KV pool now; unfinished requests are aborted."""
        self.core_client.shutdown()
