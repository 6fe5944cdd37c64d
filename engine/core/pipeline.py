"""Async scheduling (vLLM v1's): the host schedules and packs step N+1 while the device runs
step N, so that the host's work hides behind the device's.

One step is in flight at a time. A call of `step()`:
1. takes the step in flight as done (`Scheduler.advance_inflight`: its tokens computed, a
   PLACEHOLDER for each token it samples);
2. schedules the next step and launches it (`ModelRunner.launch`): a decode row whose input
   is a placeholder takes its token from the step in flight's samples on the device;
3. waits for the step in flight's samples and resolves them (`Scheduler.resolve_inflight`:
   placeholders become tokens, stops are checked) into the outputs it returns.
So outputs come one call later, and a request that stopped (EOS, a stop token, a stop string
the front-end found, an abort) may already be in the next step: that row's token is dropped,
never emitted; `max_tokens` and `max_model_len` are never exceeded (a request whose
placeholders reach them is not scheduled again). Preemption and prefix caching work on
resolved tokens only.

A step whose sampling needs the previous tokens on the host runs synchronously, after the
step in flight is drained: speculative decoding, a grammar (its next mask follows the last
token), repetition, presence or frequency penalties (they count the output).
"""

import time
from typing import TYPE_CHECKING

from kvdeck.engine.core.request import token_output
from kvdeck.engine.core.scheduler import ScheduledBatch
from kvdeck.engine.runner.async_step import LaunchedStep
from kvdeck.engine.types.stats import StepSummary
from kvdeck.engine.types.wire import EngineCoreOutput

if TYPE_CHECKING:
    from kvdeck.engine.core.engine_core import EngineCore


class StepPipeline:
    def __init__(self, core: "EngineCore") -> None:
        self.core = core
        self.inflight: tuple[ScheduledBatch, LaunchedStep] | None = None

    @property
    def busy(self) -> bool:
        return self.inflight is not None

    def step(self) -> list[EngineCoreOutput]:
        core = self.core
        if not core.pipelinable():
            return self.drain() if self.inflight is not None else core.step_sync()
        started = time.perf_counter()
        previous = self.inflight
        if previous is not None:
            core.scheduler.advance_inflight(previous[0])
        batch = core.scheduler.schedule(pipelined=True)
        scheduled = time.perf_counter()
        self.inflight = None
        if not batch.empty:
            launched = core.runner.launch(batch, previous[1] if previous is not None else None)
            self.inflight = (batch, launched)
            # Enqueuing the step's work (CUDA) is the model's; packing it counts when resolved.
            core.timings.model_s += time.perf_counter() - scheduled - launched.prepare_s
        core.timings.schedule_s += scheduled - started
        return self._resolve(*previous) if previous is not None else []

    def drain(self) -> list[EngineCoreOutput]:
        """Resolve the step in flight, launching none (the next step runs synchronously)."""
        batch, launched = self.inflight
        self.inflight = None
        return self._resolve(batch, launched)

    def _resolve(self, batch: ScheduledBatch, launched: LaunchedStep) -> list[EngineCoreOutput]:
        core = self.core
        waited = time.perf_counter()
        result = launched.result()
        arrived = time.perf_counter()
        if core.scheduler.swap is not None:
            core.scheduler.swap.collect(batch.step, core.runner.kv_swap, core.timings)
        sampled = [None if s is None else s.token_id for s in result.samples]
        finished, taken = core.scheduler.resolve_inflight(batch, sampled)
        outputs = core._fail(batch, result.failures)
        for request, sample, took in zip(batch.requests, result.samples, taken):
            if took:
                outputs.append(token_output(request, [sample]))
        core.generation_tokens_total += len(outputs)
        core.num_steps += 1
        core.last_step = StepSummary(batch.num_prefill_tokens, batch.num_decode_tokens,
                                     len(batch.requests), result.total_s)
        for request in finished:
            core._forget(request)
        # The host's own time: packing (in the launch), resolving; "model" is the wait.
        core.timings.add(schedule=0.0, prepare=launched.prepare_s, model=arrived - waited,
                         update=time.perf_counter() - arrived)
        return outputs
