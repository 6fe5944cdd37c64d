"""The in-process core client: the EngineCore runs in the caller's process and thread.
No IPC: `step()` runs one engine step and returns its outputs."""

from kvdeck.engine.core.engine_core import EngineCore
from kvdeck.engine.runner.model_runner import ProgressCallback
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.stats import EngineStats, KVOccupancy, StepTimings
from kvdeck.engine.types.wire import EngineCoreOutput, EngineCoreRequest, EngineInfo, RequestStatus


class InprocCoreClient:
    def __init__(self, config: EngineConfig, progress: ProgressCallback | None = None) -> None:
        self.core = EngineCore(config, progress)

    @property
    def info(self) -> EngineInfo:
        return self.core.info

    def add_request(self, request: EngineCoreRequest) -> None:
        self.core.add_request(request)

    def abort_requests(self, request_ids: list[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.core.abort_requests(request_ids, status)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter (checked first; ValueError naming the problem); False if held already."""
        return self.core.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.core.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self.core.list_loras()

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        return self.core.step()

    def stats(self) -> EngineStats:
        return self.core.stats()

    def occupancy(self) -> KVOccupancy:
        return self.core.occupancy()

    def step_timings(self) -> StepTimings:
        return self.core.timings

    def reset_timings(self) -> None:
        self.core.reset_timings()

    def reset_prefix_cache(self) -> None:
        self.core.reset_prefix_cache()

    def shutdown(self) -> None:
        self.core.shutdown()
