"""The front-end's bookkeeping per request: detokenise, apply stop strings, build outputs."""

import time
from dataclasses import dataclass, field

from kvdeck.engine.frontend.detokenizer import IncrementalDetokenizer
from kvdeck.engine.types.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.wire import EngineCoreOutput


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> None:
        self.states[request_id] = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            params=params,
            detokenizer=IncrementalDetokenizer(
                self.tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                stop=list(params.stop),
                include_stop_str_in_output=params.include_stop_str_in_output,
            ),
            metrics=RequestMetrics(arrival_time=arrival_time),
            logprobs=[] if params.logprobs is not None else None,
        )

    def has_request(self, request_id: str) -> bool:
        return request_id in self.states

    def process(self, core_outputs: list[EngineCoreOutput],
                ) -> tuple[list[RequestOutput], list[str], list[str]]:
        """Outputs for the caller; ids a stop string finished and ids whose output could not be
        processed (both still running in the core, to be finished there)."""
        outputs: list[RequestOutput] = []
        stopped_by_string: list[str] = []
        failed: list[str] = []
        for core_output in core_outputs:
            state = self.states.get(core_output.request_id)
            if state is None:
                continue  # aborted on this side already
            try:
                output = self._update(state, core_output)
            except Exception as exc:  # this request's text could not be made: end it alone
                output = self._build(state, "", [], "error", None, 0,
                                     error=f"{type(exc).__name__}: {exc}")
                if not core_output.finished:
                    failed.append(state.request_id)
            if output.finished:
                del self.states[state.request_id]
                if state.detokenizer.stop_reason is not None and not core_output.finished:
                    stopped_by_string.append(state.request_id)
            outputs.append(output)
        return outputs, stopped_by_string, failed

    def abort(self, request_id: str, error: str | None = None) -> RequestOutput | None:
        """End a request here: its final output, finish_reason "abort" (or "error" with a
        reason, when the engine lost it)."""
        state = self.states.pop(request_id, None)
        if state is None:
            return None
        return self._build(state, "", [], "error" if error else "abort", None, 0, error)

    def _update(self, state: RequestState, core_output: EngineCoreOutput) -> RequestOutput:
        if core_output.metrics is not None:
            m = core_output.metrics
            state.metrics.first_scheduled_time = m.first_scheduled_time
            state.metrics.first_token_time = m.first_token_time
            state.metrics.last_token_time = m.last_token_time
            state.metrics.finished_time = m.finished_time
            state.metrics.grammar_compile_s = m.grammar_compile_s
        new_ids = core_output.new_token_ids
        detok = state.detokenizer
        delta = ""
        if state.params.detokenize:
            delta = detok.add_tokens(new_ids, core_output.finished)
            new_ids = new_ids[: detok.tokens_used]  # a stop string ends the output at its token
        state.token_ids.extend(new_ids)
        if state.logprobs is not None and core_output.new_logprobs:
            new_logprobs = core_output.new_logprobs[: len(new_ids)]
            for entry in new_logprobs:
                for logprob in entry.values():
                    logprob.decoded = self.tokenizer.decode([logprob.token_id])
            state.logprobs.extend(new_logprobs)
        finish_reason, stop_reason = core_output.finish_reason, core_output.stop_reason
        if detok.stop_reason is not None:
            finish_reason, stop_reason = "stop", detok.stop_reason
        if finish_reason is not None and state.metrics.finished_time is None:
            state.metrics.finished_time = time.time()
        return self._build(state, delta, new_ids, finish_reason, stop_reason,
                           core_output.num_cached_tokens, core_output.error)

    def _build(self, state: RequestState, delta: str, new_ids: list[int], finish_reason: str | None,
               stop_reason: int | str | None, num_cached: int,
               error: str | None = None) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text=state.detokenizer.text[: state.detokenizer.emitted],
            token_ids=list(state.token_ids),
            finish_reason=finish_reason,
            logprobs=state.logprobs,
            stop_reason=stop_reason,
        )
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=[completion],
            finished=finish_reason is not None,
            metrics=state.metrics,
            delta_text=delta,
            delta_token_ids=list(new_ids),
            num_cached_tokens=num_cached,
            error=error,
        )
