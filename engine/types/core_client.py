"""The one interface a front-end has to an EngineCore, whatever process it runs in.

Two implementations, in engine/core_client/: `InprocCoreClient` (the core in this process:
the offline `LLM`, tests) and `CoreProcess` (the core in a spawned process: the TUI, the
server). Requests go in as `EngineCoreRequest`s; outputs come back from
`InprocCoreClient.step()` or, from the process, as `StepOutputs` messages.
"""

from typing import Protocol

from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.wire import EngineCoreRequest, RequestStatus


class CoreClient(Protocol):
    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request. In-process, a ValueError is raised here; a subprocess core
        answers with a RequestRejected message instead."""

    def abort_requests(self, request_ids: list[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        """Finish requests now and free their blocks (FINISHED_STOPPED: a stop string)."""

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter into the engine (vLLM's name); False if it holds it already.
        ValueError naming the problem for a bad adapter. (The subprocess client blocks; its
        `call("add_lora", ...)` returns a future instead.)"""

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop an adapter's copies; False if the engine did not hold it."""

    def list_loras(self) -> list[int]:
        """The ids of the adapters the engine holds."""
