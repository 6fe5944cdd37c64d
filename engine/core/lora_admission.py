"""The scheduler's LoRA limit: a step holds at most max_loras distinct adapters (the runner
has that many slots). Every running request runs each step, so the limit is kept at
admission: a waiting request whose adapter is not among the running ones' waits while
max_loras adapters are running, and keeps its place (FCFS among such requests); the requests
behind it (the base's, or running adapters') are admitted meanwhile, so nobody is starved by it.
"""

from collections.abc import Iterable

from kvdeck.engine.core.request import Request
from kvdeck.engine.types.lora import LoRARequest


def check_id_free(lora: LoRARequest, live: Iterable[Request]) -> None:
    """ValueError if a live request runs another adapter under `lora`'s id: while any request
    uses an id, it names one adapter (its slot, its host copy)."""
    for request in live:
        other = request.lora_request
        if other is not None and other.lora_int_id == lora.lora_int_id and other != lora:
            raise ValueError(f"lora_int_id {lora.lora_int_id} is adapter {other.lora_name!r} "
                             f"({other.lora_path}) for requests still running; use another id")


class LoRAAdmission:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras

    def admits(self, request: Request, running: Iterable[Request]) -> bool:
        """Whether `request` may join `running` without a step holding too many adapters."""
        lora = request.lora_request
        if lora is None:
            return True
        active = {r.lora_request.lora_int_id for r in running if r.lora_request is not None}
        return lora.lora_int_id in active or len(active) < self.max_loras
