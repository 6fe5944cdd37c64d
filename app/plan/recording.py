"""A recorded session (app/record, `--record FILE`) as the planner's input: its finished
requests as a workload (arrival times, prompt and output lengths; prompt token ids rebuilt
so that each request's recorded prefix-cache hit can recur), a step-cost model fitted to its
step records, and the recorded figures the prediction is compared with."""

import random
import sqlite3
import zlib
from dataclasses import dataclass, field

from kvdeck.app.plan.cost_model import FittedCostModel, StepSample, StepShape
from kvdeck.app.plan.model_shapes import ModelShape, find_model_shape
from kvdeck.app.plan.report import Comparison, percentile
from kvdeck.app.plan.simulate import SimResult
from kvdeck.app.plan.workload import FIRST_TOKEN_ID, FixedWorkload, PlannedRequest

TTFT_TOLERANCE = 0.20  # the target: TTFT p50 and ITL p50 within 20%, peak KV blocks exact
ITL_TOLERANCE = 0.20


@dataclass(slots=True)
class RecordedSession:
    path: str
    engine: object  # app.record.reader.RecordedEngine
    shape: ModelShape
    workload: FixedWorkload
    cost_model: FittedCostModel
    ttft_p50_s: float | None
    itl_p50_s: float | None
    peak_blocks: int | None
    num_preemptions: int | None
    num_steps: int | None
    notes: list[str] = field(default_factory=list)
    snapshot_times: list[float] = field(default_factory=list)  # workload time of each snapshot
    # The pool after every step is known (a step record or a snapshot each); else sampled
    # by the snapshots, ~15 a second.
    every_step: bool = False

    @property
    def replays_by_step(self) -> bool:
        """Whether the pool after every step is recorded and every request's first step, so a
        replay with the engine's batches (simulate's by_step) must hold exactly its blocks."""
        return self.every_step and all(r.arrival_step is not None for r in self.workload.requests)

    def compare(self, result: SimResult, by_step: SimResult | None = None) -> list[Comparison]:
        """`result`: the prediction (requests at their recorded times); `by_step`: the replay
        with each request at its recorded first step (the peak's exact check where given)."""
        ttfts = [r.ttft_s for r in result.requests if r.ttft_s is not None]
        gaps = [g for r in result.requests for g in r.token_gaps_s]
        timed_peak = result.peak_blocks_after_step if self.every_step else result.peak_blocks_sampled
        rows = [
            Comparison("TTFT p50 (s)", self.ttft_p50_s, percentile(ttfts, 50), TTFT_TOLERANCE),
            Comparison("ITL p50 (s)", self.itl_p50_s, percentile(gaps, 50), ITL_TOLERANCE)]
        if by_step is not None:
            # The engine's batches: the fullest pool after any step must be the recorded one.
            rows += [Comparison("peak KV blocks", self.peak_blocks, by_step.peak_blocks_after_step, 0),
                     Comparison("preemptions", self.num_preemptions, by_step.num_preemptions, 0),
                     Comparison("steps", self.num_steps, by_step.num_steps, 0),
                     # Timed by the cost model, a step more or less shifts the batches.
                     Comparison("peak KV blocks, by time", self.peak_blocks, timed_peak, None)]
        else:
            # The fullest state after any step against the simulation's after each of its steps
            # when the recording knows every step's, else at the snapshots' times.
            rows += [Comparison("peak KV blocks", self.peak_blocks, timed_peak, 0),
                     # What snapshots ~15 a second may miss: the simulation's fullest state.
                     Comparison("peak KV blocks, any step", self.peak_blocks,
                                result.peak_blocks_after_step, None)]
        return rows + [
            Comparison("preemptions, by time", self.num_preemptions, result.num_preemptions, None),
            Comparison("steps, by time", self.num_steps, result.num_steps, None)]


def load_session(path: str) -> RecordedSession:
    """ValueError (the reader's RecordingError) naming the problem for a file that is not a
    usable recording."""
    try:
        from kvdeck.app.record.reader import open_recording
    except ImportError:
        raise ValueError("this kvdeck cannot read recordings (no kvdeck.app.record)") from None
    try:
        return _load(open_recording, path)
    except sqlite3.Error as exc:  # a file the reader's checks let through, damaged further on
        raise ValueError(f"{path}: cannot read this recording ({exc})") from None


def _load(open_recording, path: str) -> RecordedSession:
    with open_recording(path) as recording:
        engine = recording.engine
        if not engine.num_blocks or not engine.block_size:
            raise ValueError(f"{path}: the recording does not say the engine's pool (num_blocks, "
                             "block_size); give --num-blocks and --block-size")
        try:
            shape = find_model_shape(engine.model or "")
        except ValueError:
            raise ValueError(f"{path}: the recorded model {engine.model!r} is not here to read "
                             "its shape; give --model (a named shape or its directory)") from None
        finished = recording.finished_requests()
        timed_snapshots = list(recording.snapshots())
        snapshots = [stats for _, stats in timed_snapshots]
        steps = recording.steps()
        latencies = recording.latencies()
    notes: list[str] = []
    requests, t0 = _requests(finished, shape.vocab_size, notes)
    if not requests:
        raise ValueError(f"{path}: the recording holds no finished requests with arrival times")
    # The engine's first step began after the requests that came before it had arrived.
    first = steps[0] if steps else None
    start_s = max(0.0, first.t - (first.duration_s or 0.0) - t0) if first is not None else 0.0
    samples = [StepSample(StepShape(s.num_seqs, s.decode_tokens, s.prefill_tokens, 0), s.duration_s)
               for s in steps if s.duration_s and s.num_seqs is not None
               and s.prefill_tokens is not None and s.decode_tokens is not None]
    cost = FittedCostModel.fit(samples, f"the recording {path}")
    overhead = _host_overhead(steps)
    if overhead is None:  # no step listener (an attached dashboard's recording): snapshots
        overhead = _host_overhead_from_snapshots(timed_snapshots, samples)
    if overhead is not None:
        cost = cost.with_host_overhead(overhead, "(schedule, update, front-end: the recorded step "
                                                 "rate less the steps' device times)")
    ttfts = [r.timeline.ttft.total_s for r in finished if r.timeline is not None
             and r.timeline.ttft is not None]
    itls = [seconds for kind, _, seconds in latencies if kind == "itl"]
    if not itls:
        itls = _mean_itls(finished)
        notes.append("ITL p50 recorded: each request's mean gap (the file has no ITL samples)")
    last = snapshots[-1] if snapshots else None
    every_step = _every_step_held(steps, last.num_steps if last else 0)
    if every_step:
        peak = max(s.used_blocks for s in steps)
        notes.append(f"peak KV blocks: the pool's fullest state after any of the recording's "
                     f"{len(steps)} steps, against the simulated pool after each of its steps")
    else:
        peak = max((s.num_blocks - s.num_free_blocks for s in snapshots), default=None)
        notes.append(f"peak KV blocks: the fullest of the recording's {len(snapshots)} snapshots, "
                     "and of the simulated pool at the same times (the table's peak: at every step)")
    return RecordedSession(
        path, engine, shape,
        FixedWorkload(requests, f"recorded: {len(requests)} requests from {path}", start_s),
        cost, percentile(ttfts, 50), percentile(itls, 50), peak,
        last.num_preemptions if last else None, last.num_steps if last else None, notes,
        [t - t0 for t, _ in timed_snapshots],
        every_step or (bool(last) and len({s.num_steps for s in snapshots}) >= last.num_steps))


def _every_step_held(steps: list, num_steps: int) -> bool:
    """Whether the recording says the blocks held after every step of the engine's life
    (steps 1..num_steps, each with used_blocks: a step listener from the first step on)."""
    if not steps or num_steps <= 0 or len(steps) < num_steps:
        return False
    return steps[0].step <= 1 and steps[-1].step >= num_steps and all(
        s.used_blocks is not None for s in steps)


def _host_overhead(steps: list) -> float | None:
    """What a step costs beyond its recorded duration (the runner's prepare, forward and
    sampling): the median time between two decode steps the step listener saw one after the
    other, less the median duration of the decode steps a snapshot described. (Not the
    described steps' own gaps: building the snapshot lands in those, about a quarter of a
    millisecond on the demo model.) None without enough of either."""
    described = {s.step for s in steps if s.duration_s}
    decode = [s for s in steps if s.duration_s and s.prefill_tokens == 0 and s.decode_tokens]
    if len(decode) < 5:
        return None
    most_rows = max(s.decode_tokens for s in decode)
    gaps = [step.t - previous.t for previous, step in zip(steps, steps[1:])
            if step.step == previous.step + 1 and not {step.step, previous.step} & described
            and 0 < step.tokens <= most_rows and 0 < step.t - previous.t < 0.05]
    if len(gaps) < 5:
        return None
    return max(0.0, _median(gaps) - _median([s.duration_s for s in decode]))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _host_overhead_from_snapshots(snapshots: list, samples: list[StepSample]) -> float | None:
    """The same from snapshots alone: the mean step period between two snapshots that both
    saw requests running, less the median recorded duration (coarser: the step mix between
    them is not known)."""
    periods = []
    for (t1, a), (t2, b) in zip(snapshots, snapshots[1:]):
        if a.num_running and b.num_running and b.num_steps > a.num_steps:
            periods.append((t2 - t1) / (b.num_steps - a.num_steps))
    if len(periods) < 5 or not samples:
        return None
    periods.sort()
    durations = sorted(s.seconds for s in samples)
    return max(0.0, periods[len(periods) // 2] - durations[len(durations) // 2])


def _arrival(request) -> float | None:
    if request.arrival_time is not None:
        return request.arrival_time
    timeline = request.timeline
    if timeline is not None and timeline.phases:  # finished_at is its last phase, on its clock
        return request.finished_at - (timeline.phases[-1][0] - timeline.queued_at)
    return None


def _requests(finished: list, vocab_size: int, notes: list[str]) -> tuple[list[PlannedRequest], float]:
    """Prompts of random ids, except that a request whose prompt hit the prefix cache for c
    tokens starts with the first c tokens of the latest earlier prompt at least that long
    (the token ids are not recorded; this makes the same hits possible). Also the first
    arrival's time, the workload's zero."""
    timed = [(a, r) for r in finished if (a := _arrival(r)) is not None and _outputs(r) > 0]
    if len(timed) < len(finished):
        notes.append(f"{len(finished) - len(timed)} recorded requests without an arrival time or "
                     "output were left out")
    timed.sort(key=lambda pair: pair[0])
    t0 = timed[0][0] if timed else 0.0
    prompts: list[list[int]] = []
    out = []
    for arrival, request in timed:
        rng = random.Random(zlib.crc32(request.request_id.encode()))
        cached = min(request.cached_tokens, request.prompt_tokens)
        donor = next((p for p in reversed(prompts) if len(p) >= cached), None) if cached else None
        prefix = donor[:cached] if donor is not None else []
        prompt = prefix + [rng.randrange(FIRST_TOKEN_ID, vocab_size)
                           for _ in range(request.prompt_tokens - len(prefix))]
        prompts.append(prompt)
        timeline = request.timeline
        first_step = timeline.prefill_chunks[0][0] if timeline is not None \
            and timeline.prefill_chunks else None
        out.append(PlannedRequest(request.request_id, arrival - t0, prompt, _outputs(request),
                                  arrival_step=first_step))
    return out, t0


def _outputs(request) -> int:
    """Its output tokens: the record's count, or what its timeline's decode runs emitted plus
    the token its prefill sampled, if more (a final output streamed as deltas carries only
    the last delta's tokens)."""
    timeline = request.timeline
    from_runs = sum(run[2] for run in timeline.decode_runs) + 1 if timeline is not None \
        and timeline.ttft is not None else 0
    return max(request.output_tokens, from_runs)


def _mean_itls(finished: list) -> list[float]:
    out = []
    for request in finished:
        timeline = request.timeline
        if timeline is None or timeline.ttft is None or _outputs(request) < 2:
            continue
        first = timeline.queued_at + timeline.ttft.total_s
        out.append((timeline.phases[-1][0] - first) / (_outputs(request) - 1))
    return out
