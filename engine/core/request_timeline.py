"""What happened to one request, recorded as the scheduler handles it (the events it already
handles: queued, admitted, a prefill chunk, preempted, finished; never per token), bounded,
and turned into a TimelineSnapshot only when someone asks (a stats snapshot, the finish)."""

from dataclasses import dataclass, field

from kvdeck.engine.types.request_timeline import (
    DECODE,
    FINISHED,
    PREEMPTED,
    PREFILL,
    QUEUED,
    SWAPPED,
    TimelineSnapshot,
    TTFTParts,
)

MAX_PHASES = 48
MAX_CHUNKS = 64
MAX_RUNS = 32
MAX_PREEMPTIONS = 16


@dataclass(slots=True)
class RequestTimeline:
    queued_at: float
    phase: str = QUEUED
    phases: list[tuple[float, str]] = field(default_factory=list)
    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    preemptions: list[tuple[float, int, str]] = field(default_factory=list)
    swaps: list[tuple[int, int, float]] = field(default_factory=list)  # (step, bytes, seconds)
    first_scheduled_at: float | None = None
    last_chunk_at: float | None = None  # the last prefill chunk before the first token
    first_token_at: float | None = None
    # The decode run under way: its first step and the output length it started from.
    run_first_step: int | None = None
    run_output_start: int = 0
    # Since the latest admission: its chunks (the reason line's "chunk i of n") and cache hit.
    chunks_since_admit: int = 0
    cached_at_admit: int = 0
    finish_reason: str | None = None
    dropped: int = 0

    def __post_init__(self) -> None:
        self.phases.append((self.queued_at, QUEUED))

    def _enter(self, now: float, phase: str) -> None:
        self.phase = phase
        if len(self.phases) >= MAX_PHASES:  # keep the first (the bar's start) and the newest
            del self.phases[1]
            self.dropped += 1
        self.phases.append((now, phase))

    def admitted(self, now: float, num_cached: int) -> None:
        if self.first_scheduled_at is None:
            self.first_scheduled_at = now
        self.chunks_since_admit = 0
        self.cached_at_admit = num_cached
        self._enter(now, PREFILL)

    def prefill_chunk(self, now: float, step: int, num_tokens: int, num_cached: int, last: bool) -> None:
        self.chunks_since_admit += 1
        if len(self.chunks) >= MAX_CHUNKS:  # fold into the newest: the totals stay right
            _, tokens, cached = self.chunks[-1]
            self.chunks[-1] = (step, tokens + num_tokens, cached + num_cached)
            self.dropped += 1
        else:
            self.chunks.append((step, num_tokens, num_cached))
        if last and self.first_token_at is None:
            self.last_chunk_at = now

    def decoding(self, now: float, step: int, num_output_tokens: int) -> None:
        """Its prefill (or recompute) sampled a token: decode steps follow from the next step."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.run_first_step = step + 1
        self.run_output_start = num_output_tokens
        self._enter(now, DECODE)

    def _close_run(self, step: int, num_output_tokens: int) -> None:
        first = self.run_first_step
        self.run_first_step = None
        tokens = num_output_tokens - self.run_output_start
        if first is None or tokens <= 0:
            return
        if len(self.runs) >= MAX_RUNS:
            start, _, before = self.runs.pop()
            first, tokens = start, tokens + before
            self.dropped += 1
        self.runs.append((first, max(first, step), tokens))

    def preempted(self, now: float, step: int, needed_by: str, num_output_tokens: int,
                  swapped_bytes: int = 0) -> None:
        """`swapped_bytes`: its K/V went to host swap space (0: it will be recomputed)."""
        self._close_run(step - 1, num_output_tokens)  # its last decode was the step before
        if len(self.preemptions) >= MAX_PREEMPTIONS:
            self.preemptions.pop(0)
            self.dropped += 1
        self.preemptions.append((now, step, needed_by))
        if swapped_bytes:
            if len(self.swaps) >= MAX_PREEMPTIONS:
                self.swaps.pop(0)
            self.swaps.append((step, swapped_bytes, 0.0))
        self._enter(now, SWAPPED if swapped_bytes else PREEMPTED)

    def swap_copied(self, seconds: float) -> None:
        """The runner timed a copy of its latest swap (out, or back in): add it to the cost."""
        if self.swaps:
            step, nbytes, spent = self.swaps[-1]
            self.swaps[-1] = (step, nbytes, spent + seconds)

    def resumed(self, now: float, step: int, num_output_tokens: int, prefilling: bool) -> None:
        """Swapped back in: it goes on where it stopped, nothing recomputed."""
        if prefilling:
            self._enter(now, PREFILL)
        else:
            self.decoding(now, step - 1, num_output_tokens)  # decodes from this step on

    def finished(self, now: float, step: int, reason: str, num_output_tokens: int) -> None:
        self._close_run(step, num_output_tokens)
        self.finish_reason = reason
        self._enter(now, FINISHED)

    def ttft(self) -> TTFTParts | None:
        if self.first_token_at is None or self.first_scheduled_at is None:
            return None
        last_chunk = self.last_chunk_at if self.last_chunk_at is not None else self.first_scheduled_at
        return TTFTParts(queue_s=self.first_scheduled_at - self.queued_at,
                         prefill_s=last_chunk - self.first_scheduled_at,
                         first_step_s=self.first_token_at - last_chunk)

    def snapshot(self, now: float, step: int, num_output_tokens: int) -> TimelineSnapshot:
        runs = list(self.runs)
        if self.run_first_step is not None and num_output_tokens > self.run_output_start:
            runs.append((self.run_first_step, max(self.run_first_step, step),
                         num_output_tokens - self.run_output_start))
        return TimelineSnapshot(
            queued_at=self.queued_at, taken_at=now, phases=list(self.phases),
            prefill_chunks=list(self.chunks), decode_runs=runs, preemptions=list(self.preemptions),
            swaps=list(self.swaps),
            finish_reason=self.finish_reason, ttft=self.ttft(), dropped_events=self.dropped)
