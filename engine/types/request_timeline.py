"""One request's timeline as it travels (stats snapshots, the final output, the server's JSON):
what answers "why is this request slow". Times are time.monotonic() seconds (one clock for
every process on a machine); steps count the scheduler's batches."""

from dataclasses import dataclass, field

# Phases of a request's life, in the order a plain one passes them.
QUEUED, PREFILL, DECODE, PREEMPTED, FINISHED = "queued", "prefill", "decode", "preempted", "finished"
SWAPPED = "swapped"  # preempted with its K/V copied to host swap space (a preemption of kind swap)


@dataclass(slots=True)
class TTFTParts:
    """Time to first token, in three parts that sum to it."""

    queue_s: float  # arrival -> first scheduled
    prefill_s: float  # first scheduled -> its last prefill chunk scheduled (the earlier chunks)
    first_step_s: float  # -> the first token emitted (the step that ran the last chunk)

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.first_step_s


@dataclass(slots=True)
class TimelineSnapshot:
    queued_at: float
    taken_at: float  # when this snapshot was taken: the end of a phase still open
    # (when, phase) at each change of phase, oldest first (capped: the first and the newest kept).
    phases: list[tuple[float, str]] = field(default_factory=list)
    prefill_chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (step, tokens, cached)
    # Decode steps as runs: (first step, last step, tokens emitted by them: one a step without
    # speculation). An open run ends at the latest step.
    decode_runs: list[tuple[int, int, int]] = field(default_factory=list)
    # (when, step, the request that needed its blocks; "" when it was itself, the newest).
    preemptions: list[tuple[float, int, str]] = field(default_factory=list)
    # The preemptions that swapped (the others recomputed): (step, bytes copied out, seconds
    # its copies took, out and back in, as the runner timed its steps' copies).
    swaps: list[tuple[int, int, float]] = field(default_factory=list)
    spec_verify_steps: int = 0  # speculative decoding: steps that verified drafts
    spec_drafted: int = 0
    spec_accepted: int = 0
    grammar_compile_s: float | None = None
    finish_reason: str | None = None
    ttft: TTFTParts | None = None
    dropped_events: int = 0  # merged or dropped to keep it bounded

    def durations(self) -> list[tuple[str, float]]:
        """(phase, seconds) for each phase in order, the open one up to taken_at."""
        out = []
        for (start, phase), (end, _) in zip(self.phases, [*self.phases[1:], (self.taken_at, "")]):
            if phase != FINISHED:
                out.append((phase, max(0.0, end - start)))
        return out


def timeline_from_dict(data: dict) -> TimelineSnapshot:
    """The inverse of the JSON form (lists back into tuples; unknown keys ignored)."""
    names = set(TimelineSnapshot.__slots__)
    values = {key: value for key, value in data.items() if key in names}
    for key in ("phases", "prefill_chunks", "decode_runs", "preemptions", "swaps"):
        values[key] = [tuple(item) for item in values.get(key, [])]
    if values.get("ttft") is not None:
        values["ttft"] = TTFTParts(**{k: v for k, v in values["ttft"].items()
                                      if k in TTFTParts.__slots__})
    return TimelineSnapshot(**values)
