"""The scheduler's LoRA limit: a step holds at most max_loras distinct adapters (the runner
has that many slots). Every running request runs each step, so the limit is kept at
admission: a waiting request whose adapter is not among the running ones' waits while
max_loras adapters are running, and keeps its place (FCFS among such requests); the requests
behind it (the base's, or running adapters') are admitted meanwhile, so nobody is starved by it.
"""

from collections.abc import Iterable

from kvdeck.engine.core.request import Request


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
