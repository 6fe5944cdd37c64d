"""One request to a remote OpenAI-compatible server, in the engine client's shapes: the
SamplingParams become a request body, and the streamed chunks become the cumulative
RequestOutputs the chat pane and the load generator read from a local engine.

Token ids come from vLLM's `return_token_ids` (kvdeck's server sends them too). A server
that ignores it still streams one chunk per token in practice; then each content chunk
counts as one token whose id is unknown (UNKNOWN_TOKEN_ID), and the final usage corrects
the count.
"""

import time
from dataclasses import dataclass

from kvdeck.engine.types.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams

UNKNOWN_TOKEN_ID = -1  # a token the server did not name (no return_token_ids)
# vLLM's extras, sent only when they differ from its defaults (other servers may refuse them)
_EXTRA_DEFAULTS = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                   "ignore_eos": False, "skip_special_tokens": True,
                   "include_stop_str_in_output": False}


def request_body(model: str, params: SamplingParams, prompt: str | list[int] | None,
                 messages: list[dict] | None) -> tuple[str, dict]:
    """(path, JSON body) for /v1/chat/completions (messages) or /v1/completions (prompt)."""
    if params.n != 1:
        raise ValueError("an attached chat asks for one choice at a time (n = 1)")
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "return_token_ids": True, "temperature": params.temperature,
                  "top_p": params.top_p, "presence_penalty": params.presence_penalty,
                  "frequency_penalty": params.frequency_penalty}
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    for name, default in _EXTRA_DEFAULTS.items():
        if getattr(params, name) != default:
            body[name] = getattr(params, name)
    constraint = params.structured_outputs
    if constraint is not None:
        kind = constraint.kind
        body["structured_outputs"] = ({"json_object": True} if kind == "json_object"
                                      else {kind: list(constraint.choice) if kind == "choice"
                                            else getattr(constraint, kind)})
    if messages is not None:
        if params.logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, params.logprobs
        return "/v1/chat/completions", {**body, "messages": messages}
    if prompt is None:
        raise ValueError("give a prompt or messages")
    if params.logprobs is not None:
        body["logprobs"] = params.logprobs
    return "/v1/completions", {**body, "prompt": prompt}


@dataclass(slots=True)
class ReplyAccumulator:
    """Folds streamed chunks into cumulative RequestOutputs."""

    request_id: str
    prompt: str | None
    metrics: RequestMetrics
    text: str = ""
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @classmethod
    def start(cls, request_id: str, prompt: str | None) -> "ReplyAccumulator":
        return cls(request_id, prompt, RequestMetrics(arrival_time=time.time()), token_ids=[])

    def add_chunk(self, chunk: dict) -> RequestOutput | None:
        """The output after this chunk, or None when it carried nothing new."""
        if chunk.get("prompt_token_ids") is not None:  # chat: on the first chunk
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        usage = chunk.get("usage")
        if usage:
            self._apply_usage(usage)
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("prompt_token_ids") is not None:  # completions: on the first chunk
            self.prompt_token_ids = list(choice["prompt_token_ids"])
        delta_text = choice.get("text")
        if delta_text is None:
            delta_text = (choice.get("delta") or {}).get("content") or ""
        new_ids = choice.get("token_ids")
        if new_ids is None:
            new_ids = [UNKNOWN_TOKEN_ID] if delta_text else []
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            self.stop_reason = choice.get("stop_reason")
        if not delta_text and not new_ids and self.finish_reason is None:
            return None  # the role chunk
        now = time.time()
        if new_ids:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
            self.metrics.last_token_time = now
        self.text += delta_text
        self.token_ids.extend(new_ids)
        return self.output(delta_text, list(new_ids), finished=False)

    def _apply_usage(self, usage: dict) -> None:
        details = usage.get("prompt_tokens_details") or {}
        self.num_cached_tokens = int(details.get("cached_tokens") or 0)
        completion = usage.get("completion_tokens")
        # Without ids, the count of chunks may be off: pad or trim to the server's count.
        if isinstance(completion, int) and all(t == UNKNOWN_TOKEN_ID for t in self.token_ids):
            self.token_ids = [UNKNOWN_TOKEN_ID] * completion
        if self.prompt_token_ids is None and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_token_ids = [UNKNOWN_TOKEN_ID] * usage["prompt_tokens"]

    def finish(self) -> RequestOutput:
        self.metrics.finished_time = time.time()
        return self.output("", [], finished=True)

    def output(self, delta_text: str, delta_ids: list[int], finished: bool) -> RequestOutput:
        completion = CompletionOutput(0, self.text, list(self.token_ids),
                                      self.finish_reason if finished else None,
                                      stop_reason=self.stop_reason if finished else None)
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids or []),
                             [completion], finished, self.metrics, delta_text=delta_text,
                             delta_token_ids=delta_ids, num_cached_tokens=self.num_cached_tokens)
