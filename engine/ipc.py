"""Messages between the EngineClient and the EngineCore process (pickled over pipes).

Client -> core: AddRequest, AbortRequests, Shutdown.
Core -> client: StartupProgress (while loading), EngineReady or StartupFailed (once),
then StepOutputs (per step; stats throttled) and, if the loop breaks, EngineCrashed.
"""

from dataclasses import dataclass

from engine.core import EngineCoreOutput, EngineCoreRequest
from engine.request import RequestStatus
from engine.stats import EngineStats


# ---- client -> core ------------------------------------------------------------------
@dataclass(slots=True)
class AddRequest:
    request: EngineCoreRequest


@dataclass(slots=True)
class AbortRequests:
    request_ids: list[str]
    # FINISHED_STOPPED when the client found a stop string; FINISHED_ABORTED otherwise.
    status: RequestStatus = RequestStatus.FINISHED_ABORTED


@dataclass(slots=True)
class Shutdown:
    pass


# ---- core -> client ------------------------------------------------------------------
@dataclass(slots=True)
class StartupProgress:
    stage: str  # "starting" | "loading" | "profiling" | "capturing" | "ready"
    message: str


@dataclass(slots=True)
class EngineReady:
    model_dir: str
    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    device: str
    message: str  # what the core said when it became ready (pool size)
    stats: EngineStats


@dataclass(slots=True)
class StartupFailed:
    message: str
    traceback: str


@dataclass(slots=True)
class RequestRejected:
    """add_request raised ValueError in the core (the client checks first; this is the backstop)."""

    request_id: str
    message: str


@dataclass(slots=True)
class StepOutputs:
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None  # throttled: most steps carry none


@dataclass(slots=True)
class EngineCrashed:
    message: str
    traceback: str
