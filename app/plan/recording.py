"""A recorded session (app/record, `--record FILE`) as the planner's input: its finished
requests as a workload (arrival times, prompt and output lengths; prompt token ids rebuilt
so that each request's recorded prefix-cache hit can recur), a step-cost model fitted to its
step records, and the recorded figures the prediction is compared with."""

import random
import zlib
from dataclasses import dataclass, field

from kvdeck.app.plan.cost_model import FittedCostModel, StepSample, StepShape
from kvdeck.app.plan.model_shapes import ModelShape, find_model_shape
from kvdeck.app.plan.report import Comparison, percentile
from kvdeck.app.plan.simulate import SimResult
from kvdeck.app.plan.workload import FIRST_TOKEN_ID, FixedWorkload, PlannedRequest

TTFT_TOLERANCE = 0.20  # issue 37: TTFT p50 and ITL p50 within 20%, peak KV blocks exact
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

    def compare(self, result: SimResult) -> list[Comparison]:
        ttfts = [r.ttft_s for r in result.requests if r.ttft_s is not None]
        gaps = [g for r in result.requests for g in r.token_gaps_s]
        return [
            Comparison("TTFT p50 (s)", self.ttft_p50_s, percentile(ttfts, 50), TTFT_TOLERANCE),
            Comparison("ITL p50 (s)", self.itl_p50_s, percentile(gaps, 50), ITL_TOLERANCE),
            Comparison("peak KV blocks", self.peak_blocks, result.peak_blocks, 0),
            Comparison("preemptions", self.num_preemptions, result.num_preemptions, None),
            Comparison("steps", self.num_steps, result.num_steps, None),
        ]


def load_session(path: str) -> RecordedSession:
    """ValueError (the reader's RecordingError) naming the problem for a file that is not a
    usable recording."""
    try:
        from kvdeck.app.record.reader import open_recording
    except ImportError:
        raise ValueError("this kvdeck cannot read recordings (no kvdeck.app.record)") from None
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
        snapshots = [stats for _, stats in recording.snapshots()]
        steps = recording.steps()
        latencies = recording.latencies()
    notes: list[str] = []
    requests = _requests(finished, shape.vocab_size, notes)
    if not requests:
        raise ValueError(f"{path}: the recording holds no finished requests with arrival times")
    samples = [StepSample(StepShape(s.num_seqs, s.decode_tokens, s.prefill_tokens, 0), s.duration_s)
               for s in steps if s.duration_s and s.num_seqs is not None
               and s.prefill_tokens is not None and s.decode_tokens is not None]
    cost = FittedCostModel.fit(samples, f"the recording {path}")
    ttfts = [r.timeline.ttft.total_s for r in finished if r.timeline is not None
             and r.timeline.ttft is not None]
    itls = [seconds for kind, _, seconds in latencies if kind == "itl"]
    if not itls:
        itls = _mean_itls(finished)
        notes.append("ITL p50 recorded: each request's mean gap (the file has no ITL samples)")
    peak = max((s.num_blocks - s.num_free_blocks for s in snapshots), default=None)
    notes.append(f"recorded peak KV blocks: the fullest of {len(snapshots)} snapshots")
    last = snapshots[-1] if snapshots else None
    return RecordedSession(
        path, engine, shape, FixedWorkload(requests, f"recorded: {len(requests)} requests from {path}"),
        cost, percentile(ttfts, 50), percentile(itls, 50), peak,
        last.num_preemptions if last else None, last.num_steps if last else None, notes)


def _arrival(request) -> float | None:
    if request.arrival_time is not None:
        return request.arrival_time
    timeline = request.timeline
    if timeline is not None and timeline.phases:  # finished_at is its last phase, on its clock
        return request.finished_at - (timeline.phases[-1][0] - timeline.queued_at)
    return None


def _requests(finished: list, vocab_size: int, notes: list[str]) -> list[PlannedRequest]:
    """Prompts of random ids, except that a request whose prompt hit the prefix cache for c
    tokens starts with the first c tokens of the latest earlier prompt at least that long
    (the token ids are not recorded; this makes the same hits possible)."""
    timed = [(a, r) for r in finished if (a := _arrival(r)) is not None and r.output_tokens > 0]
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
        out.append(PlannedRequest(request.request_id, arrival - t0, prompt, request.output_tokens))
    return out


def _mean_itls(finished: list) -> list[float]:
    out = []
    for request in finished:
        timeline = request.timeline
        if timeline is None or timeline.ttft is None or request.output_tokens < 2:
            continue
        first = timeline.queued_at + timeline.ttft.total_s
        out.append((timeline.phases[-1][0] - first) / (request.output_tokens - 1))
    return out
