"""What the engine hands back: vLLM-shaped request outputs."""

from dataclasses import dataclass, field

from kvdeck.engine.types.request_timeline import TimelineSnapshot


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock timestamps (time.time()) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    grammar_compile_s: float | None = None  # structured outputs: compiling its grammar took
    timeline: TimelineSnapshot | None = None  # set when it finishes (request_timeline.py)

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass(slots=True)
class Logprob:
    token_id: int
    logprob: float
    decoded: str | None = None
    rank: int | None = None  # 1 + how many tokens were more likely (vLLM's)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    logprobs: list[dict[int, Logprob]] | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    # The sum of the generated tokens' logprobs (None unless logprobs were asked for), vLLM's.
    cumulative_logprob: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # Streaming: the text and token ids that arrived since the previous output.
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    error: str | None = None  # finish_reason "error": what went wrong with this request
    # SamplingParams.prompt_logprobs: one entry per prompt token, the first None (nothing
    # predicts it), each the token's logprob with the top candidates at its position.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # SamplingParams.embed: the prompt's L2-normalised embedding, from its first token on.
    embedding: list[float] | None = None


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]  # L2-normalised, the model's hidden size long


@dataclass(slots=True)
class EmbeddingRequestOutput:
    """LLM.embed's result for one prompt (vLLM's names)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
