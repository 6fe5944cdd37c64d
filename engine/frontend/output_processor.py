"""The front-end's bookkeeping per request: detokenise, apply stop strings, build outputs.

What an output carries follows the request's `output_kind`: CUMULATIVE copies the whole
completion into each output (a caller may keep it), DELTA hands over only the new tokens
and FINAL_ONLY builds one output at the end, so those two cost the same per token however
long the completion grows.
"""

import time
from dataclasses import dataclass, field

from kvdeck.engine.frontend.detokenizer import IncrementalDetokenizer
from kvdeck.engine.types.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams
from kvdeck.engine.types.wire import EngineCoreOutput


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)  # the completion (not kept for DELTA)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None  # of the completion's tokens, when logprobs are kept
    # The prompt's (first entry None), once the core sent them; DELTA outputs carry them once.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_logprobs_new: bool = False
    embedding: list[float] | None = None  # SamplingParams.embed, once the core sent it
    num_tokens: int = 0  # of the completion
    # DELTA outputs of token ids alone (no text, no logprobs): process() hands the core's ids
    # on without looking further (set at add_request).
    ids_only: bool = False


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
            cumulative_logprob=0.0 if params.logprobs is not None else None,
            ids_only=(params.output_kind is RequestOutputKind.DELTA and not params.detokenize
                      and params.logprobs is None and params.prompt_logprobs is None
                      and not params.embed),
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
        states = self.states
        for core_output in core_outputs:
            state = states.get(core_output.request_id)
            if state is None:
                continue  # aborted on this side already
            if state.ids_only and core_output.finish_reason is None:
                # An unfinished DELTA output of token ids alone (most outputs of a benchmark):
                # the core's ids handed on as they are, nothing else looked at. Inlined: it
                # runs for every row of every step.
                new_ids = core_output.new_token_ids
                m = core_output.metrics
                if m is not None:
                    metrics = state.metrics
                    metrics.first_scheduled_time = m.first_scheduled_time
                    metrics.first_token_time = m.first_token_time
                    metrics.last_token_time = m.last_token_time
                    metrics.grammar_compile_s = m.grammar_compile_s
                state.num_tokens += len(new_ids)
                outputs.append(RequestOutput(
                    state.request_id, state.prompt, state.prompt_token_ids,
                    [CompletionOutput(0, "", new_ids, None, None, core_output.stop_reason)],
                    False, state.metrics, "", new_ids, core_output.num_cached_tokens))
                continue
            try:
                output = self._update(state, core_output)
            except Exception as exc:  # this request's text could not be made: end it alone
                output = self._build(state, "", [], "error", None, 0,
                                     error=f"{type(exc).__name__}: {exc}")
                if not core_output.finished:
                    failed.append(state.request_id)
            if output is None:  # FINAL_ONLY, not finished
                continue
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

    def _update(self, state: RequestState, core_output: EngineCoreOutput) -> RequestOutput | None:
        m = core_output.metrics
        if m is not None:
            metrics = state.metrics
            metrics.first_scheduled_time = m.first_scheduled_time
            metrics.first_token_time = m.first_token_time
            metrics.last_token_time = m.last_token_time
            metrics.finished_time = m.finished_time
            metrics.grammar_compile_s = m.grammar_compile_s
            metrics.timeline = m.timeline
        new_ids = core_output.new_token_ids
        params = state.params
        detok = state.detokenizer
        delta = ""
        if params.detokenize:
            delta = detok.add_tokens(new_ids, core_output.finish_reason is not None)
            new_ids = new_ids[: detok.tokens_used]  # a stop string ends the output at its token
        state.num_tokens += len(new_ids)
        if params.output_kind is not RequestOutputKind.DELTA:
            state.token_ids += new_ids
        if state.logprobs is not None and core_output.new_logprobs:
            new_logprobs = core_output.new_logprobs[: len(new_ids)]
            for entry in new_logprobs:
                for logprob in entry.values():
                    logprob.decoded = self.tokenizer.decode([logprob.token_id])
            state.logprobs.extend(new_logprobs)
            for token, entry in zip(new_ids, new_logprobs):
                state.cumulative_logprob += entry[token].logprob
        if core_output.prompt_logprobs is not None:
            for entry in core_output.prompt_logprobs:
                for logprob in entry.values():
                    logprob.decoded = self.tokenizer.decode([logprob.token_id])
            state.prompt_logprobs = [None, *core_output.prompt_logprobs]
            state.prompt_logprobs_new = True
        if core_output.embedding is not None:
            state.embedding = core_output.embedding
        finish_reason, stop_reason = core_output.finish_reason, core_output.stop_reason
        if params.detokenize and detok.stop_reason is not None:
            finish_reason, stop_reason = "stop", detok.stop_reason
        if finish_reason is not None:
            if state.metrics.finished_time is None:
                state.metrics.finished_time = time.time()
        elif params.output_kind is RequestOutputKind.FINAL_ONLY:
            return None
        return self._build(state, delta, new_ids, finish_reason, stop_reason,
                           core_output.num_cached_tokens, core_output.error)

    def _build(self, state: RequestState, delta: str, new_ids: list[int], finish_reason: str | None,
               stop_reason: int | str | None, num_cached: int,
               error: str | None = None) -> RequestOutput:
        prompt_logprobs = state.prompt_logprobs
        if state.params.output_kind is RequestOutputKind.DELTA:
            logprobs = state.logprobs
            if logprobs is not None:
                logprobs = logprobs[len(logprobs) - len(new_ids):]
            completion = CompletionOutput(0, delta, new_ids, finish_reason, logprobs, stop_reason,
                                          state.cumulative_logprob)
            if not state.prompt_logprobs_new:
                prompt_logprobs = None
        else:
            completion = CompletionOutput(0, state.detokenizer.text[: state.detokenizer.emitted],
                                          list(state.token_ids), finish_reason, state.logprobs, stop_reason,
                                          state.cumulative_logprob)
        state.prompt_logprobs_new = False
        # delta_token_ids: a list of this output's own (the core's, or a slice of it).
        return RequestOutput(state.request_id, state.prompt, state.prompt_token_ids, [completion],
                             finish_reason is not None, state.metrics, delta, new_ids, num_cached, error,
                             prompt_logprobs, state.embedding)
