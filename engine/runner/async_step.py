"""A step launched without waiting for its samples: async scheduling's device side.

`ModelRunner.launch` packs a step on the host and hands the device work (the forward, the
logits, sampling) to a `DeviceQueue`, which returns a `LaunchedStep` at once; its samples
arrive later (`result()`), while the host schedules and packs the next step. Sampled token
ids stay on the device: the next step's decode rows whose input is still a placeholder
(runner/batch.py's PLACEHOLDER) take it from them there (`tokens()`).

On CUDA the work is enqueued on the stream as it runs, and the ids come back by a
non-blocking copy into pinned memory behind an event. On the CPU, where one device does
both, async scheduling is off unless asked for: then a `SimulatedDevice` stands in for the
stream, a thread that runs each step's work in order and whose results are futures, so
that the same code path runs (and is tested) without a GPU.
"""

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from kvdeck.engine.runner.sampler import DeviceSamples, Sampler, SampleResult
from kvdeck.engine.runner.step_state import StepResult


@dataclass(slots=True)
class DeviceOutcome:
    """What a step's device work left: its samples on the device, or, where batched sampling
    failed, the rows sampled one by one on the host (and why some failed)."""

    samples: DeviceSamples | None = None
    host_results: list[SampleResult | None] | None = None
    failures: dict[int, str] = field(default_factory=dict)  # sample row -> why


@dataclass(slots=True)
class LaunchedStep:
    num_requests: int
    sample_batch_index: list[int]  # sample row -> batch row
    index_of: dict[str, int]  # request id -> its sample row (the next step's placeholders)
    prepare_s: float
    started: float
    wait: Callable[[], DeviceOutcome] | None = None  # blocks until the device work is done (the queue's)
    host_tokens: torch.Tensor | None = None  # CUDA: the pinned copy of the sampled ids
    device_tokens: torch.Tensor | None = None  # CUDA: the sampled ids, on the device
    _outcome: DeviceOutcome | None = None

    def outcome(self) -> DeviceOutcome:
        if self._outcome is None:
            self._outcome = self.wait()
        return self._outcome

    def tokens(self) -> torch.Tensor:
        """The sampled ids where they were drawn (called by the next step's device work, which
        runs after this step's: on CUDA without waiting, the stream orders them)."""
        if self.device_tokens is not None:
            return self.device_tokens
        outcome = self.outcome()
        if outcome.samples is not None:
            return outcome.samples.tokens
        return torch.tensor([r.token_id if r is not None else 0 for r in outcome.host_results or []],
                            dtype=torch.long)

    def result(self) -> StepResult:
        """The samples on the host (waits for the device)."""
        outcome = self.outcome()
        if outcome.samples is not None:
            ids = self.host_tokens if self.host_tokens is not None else outcome.samples.tokens
            samples: list[SampleResult | None] = Sampler.to_results(
                outcome.samples, ids[: len(self.sample_batch_index)].tolist())
        else:
            samples = outcome.host_results or []
        results: list[SampleResult | None] = [None] * self.num_requests
        for index, sample in zip(self.sample_batch_index, samples):
            results[index] = sample
        failures = {self.sample_batch_index[row]: why for row, why in outcome.failures.items()}
        return StepResult(results, self.prepare_s, time.perf_counter() - self.started, failures)


class CudaStream:
    """The device work runs as it is enqueued; the sampled ids come back behind an event."""

    def __init__(self, max_rows: int) -> None:
        # Two pinned buffers in turns: one step's ids may wait unread while the next is copied.
        self.buffers = [torch.empty(max_rows, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self.turn = 0

    def launch(self, work: Callable[[], DeviceOutcome], step: LaunchedStep) -> LaunchedStep:
        outcome = work()
        copied = None
        if outcome.samples is not None:
            tokens = outcome.samples.tokens
            if tokens.shape[0] > self.buffers[self.turn].shape[0]:
                self.buffers[self.turn] = torch.empty(2 * tokens.shape[0], dtype=torch.long, pin_memory=True)
            step.host_tokens = self.buffers[self.turn][: tokens.shape[0]]
            self.turn ^= 1
            step.host_tokens.copy_(tokens, non_blocking=True)
            step.device_tokens = tokens
            copied = torch.cuda.Event()
            copied.record()

        def wait() -> DeviceOutcome:
            if copied is not None:
                copied.synchronize()
            return outcome

        step.wait = wait
        return step


class SimulatedDevice:
    """The CPU's stand-in for a GPU stream: each step's work runs in order on a thread of its
    own, and the host gets a future (async scheduling's tests run on it)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvdeck-device")

    def launch(self, work: Callable[[], DeviceOutcome], step: LaunchedStep) -> LaunchedStep:
        future: Future[DeviceOutcome] = self.pool.submit(work)
        step.wait = future.result
        return step

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
