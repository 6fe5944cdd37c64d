"""What crosses between a front-end and the EngineCore: requests in, token deltas and
stats out. Plain dataclasses with no torch, pickled over the process pipes by the
subprocess client and passed as they are by the in-process one.

Front-end -> core: AddRequest, AbortRequests, UtilityCall (add_lora, remove_lora,
list_loras: answered by a UtilityResult), Shutdown.
Core -> front-end: StartupProgress (while loading), EngineReady or StartupFailed (once),
then StepOutputs (per step; stats throttled), RequestRejected (a request the core refused)
and, if the loop breaks, EngineCrashed.
"""

import time
from dataclasses import dataclass, field
from enum import Enum

from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.outputs import Logprob, RequestMetrics
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.stats import EngineStats


class RequestStatus(Enum):
    """A request's state in the core; the finished ones are vLLM's finish reasons."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"  # preempted, its K/V in host swap space (resumes without recompute)
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # this request failed in the engine; the others went on

    def __init__(self, value: str) -> None:
        # A plain attribute, not a property: the core reads it for every request every step.
        self.finished = value in ("stop", "length", "abort", "error")


@dataclass(slots=True)
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.time)
    eos_token_ids: list[int] = field(default_factory=list)
    lora_request: LoRARequest | None = None  # the adapter it runs under (None: the base model)


@dataclass(slots=True)
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[dict[int, Logprob]] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # why it failed (finish_reason "error")
    # SamplingParams.prompt_logprobs: prompt positions 1.. (their tokens' logprobs and top
    # candidates), all at once, with the request's first token.
    prompt_logprobs: list[dict[int, Logprob]] | None = None
    embedding: list[float] | None = None  # SamplingParams.embed: with the first token

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """What a started engine is: told to the front-end once, at ready."""

    model_dir: str
    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    device: str
    dtype: str
    kv_bytes_per_token: int  # K and V of one token over all layers, as the pool stores them
    kv_cache_dtype: str  # what the pool stores: float32 | float16 | bfloat16 | fp8_e4m3 | fp8_e5m2 | int8
    enable_prefix_caching: bool
    weight_bytes_per_token: int  # weight bytes one decode step reads (the roofline's numerator)
    cuda_graphs: bool  # decode steps replay captured graphs
    kv_bytes_per_block: int = 0  # one block over its layer slots, 8-bit scales included
    kv_cache_tokens: int = 0  # tokens whose K/V the pool holds for every layer at once
    hidden_size: int = 0  # the model's: an embedding's length (SamplingParams.embed)
    # KV cache groups (engine/types/kv_groups.py): each one's window (None: full attention)
    # and the model layers whose K/V its blocks hold.
    kv_group_windows: list[int | None] = field(default_factory=lambda: [None])
    kv_group_layers: list[list[int]] = field(default_factory=list)
    # What the engine fell back from at start, in words ("no CUDA GPU: running on the CPU",
    # "decode steps on the Python forward: ..."): the TUI says them once (tui/alerts.py).
    fallbacks: list[str] = field(default_factory=list)


# ---- front-end -> core -----------------------------------------------------------------
@dataclass(slots=True)
class AddRequest:
    request: EngineCoreRequest


@dataclass(slots=True)
class AbortRequests:
    request_ids: list[str]
    # FINISHED_STOPPED when the front-end found a stop string; FINISHED_ABORTED otherwise.
    status: RequestStatus = RequestStatus.FINISHED_ABORTED


@dataclass(slots=True)
class Shutdown:
    pass


# The core's methods a client may call and wait on (vLLM's "utility" calls), by name.
UTILITY_METHODS = ("add_lora", "remove_lora", "list_loras")


@dataclass(slots=True)
class UtilityCall:
    call_id: int
    method: str  # one of UTILITY_METHODS
    args: tuple = ()


# ---- core -> front-end -----------------------------------------------------------------
@dataclass(slots=True)
class StartupProgress:
    stage: str  # "starting" | "loading" | "profiling" | "capturing" | "ready"
    message: str


@dataclass(slots=True)
class EngineReady:
    info: EngineInfo
    message: str  # what the core said when it became ready (pool size)
    stats: EngineStats


@dataclass(slots=True)
class StartupFailed:
    message: str
    traceback: str


@dataclass(slots=True)
class RequestRejected:
    """The core refused a request (the front-end checks first; this is the backstop)."""

    request_id: str
    message: str


@dataclass(slots=True)
class StepOutputs:
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None  # throttled: most steps carry none
    # Tokens computed by each step since the previous message (vllm:iteration_tokens_total).
    iteration_tokens: list[int] = field(default_factory=list)
    # The engine's step count when this was sent: iteration_tokens' last entry is this step
    # (a listener numbers the steps exactly, however late it started listening).
    num_steps: int = 0
    # KV blocks held after each of those steps (parallel to iteration_tokens): a recording's
    # peak is then the pool's fullest state after any step, not after the ~15 a second that
    # a stats snapshot describes.
    iteration_used_blocks: list[int] = field(default_factory=list)


@dataclass(slots=True)
class UtilityResult:
    """The answer to a UtilityCall: its result, or why it failed (a ValueError's text)."""

    call_id: int
    result: object = None
    error: str | None = None


@dataclass(slots=True)
class EngineCrashed:
    message: str
    traceback: str
