"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, params)`."""

from collections.abc import Callable

from kvdeck.engine.api.llm_engine import LLMEngine
from kvdeck.engine.frontend.parallel_sampling import choice_params, merge_choices
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats


class LLM:
    """Also a context manager: leaving the `with` block frees the model and the KV pool at
    once (`shutdown()`), instead of whenever the garbage collector gets to them."""

    def __init__(self, model: str | None = None, **config: object) -> None:
        self.engine = LLMEngine(EngineConfig.from_kwargs(model, **config))

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def generate(
        self,
        prompts: str | list[int] | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs in prompt order."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("prompts must be a string, a list of token ids, or a non-empty list of those")
        params = self._params_per_prompt(sampling_params, len(prompts))
        return self._run(prompts, params, self.engine.add_request)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the chat template is applied."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        params = self._params_per_prompt(sampling_params, len(conversations))
        return self._run(conversations, params, self.engine.add_chat_request)

    @staticmethod
    def _params_per_prompt(params, count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        if len(params) != count:
            raise ValueError(f"got {len(params)} sampling params for {count} prompts")
        return list(params)

    def _run(self, prompts: list, params: list[SamplingParams],
             add: Callable[[str | None, object, SamplingParams], str]) -> list[RequestOutput]:
        """Queue each prompt's choices with `add(request_id, prompt, params)` and run them to
        the end; one output per prompt, its choices merged."""
        request_ids: list[list[str]] = []
        queued: list[str] = []
        try:
            for prompt, prompt_params in zip(prompts, params):
                request_ids.append([])
                for choice in choice_params(prompt_params):
                    queued.append(add(None, prompt, choice))
                    request_ids[-1].append(queued[-1])
            finished: dict[str, RequestOutput] = {}
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
        except BaseException:
            # Bad input or an interrupt: leave nothing queued behind.
            self.engine.abort_request(queued)
            raise
        return [merge_choices([finished[rid] for rid in ids]) for ids in request_ids]
