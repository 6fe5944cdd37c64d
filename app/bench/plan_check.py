"""The real engine on a planner workload (app/plan/workload.py), measured as the planner
predicts it: each step's batch shape and wall time, the KV peak, preemptions, and every
request's token times. `kvdeck plan`'s validation (tests/app/plan/test_plan_vs_engine.py,
benchmarks/bench_plan_validation.py) compares the simulation against this.

Requests are added between steps once the wall clock passes their arrival (as the engine's
loop sees them), with ignore_eos and max_tokens = their output length; a finished turn's
follow-up is built from the tokens the model really generated.
"""

import time
from dataclasses import dataclass, field

from kvdeck.app.plan.cost_model import StepSample
from kvdeck.app.plan.simulate import RequestResult, step_shape
from kvdeck.app.plan.workload import PlannedRequest, Workload
from kvdeck.engine.api.llm_engine import LLMEngine
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams


@dataclass(slots=True)
class EngineRun:
    requests: list[RequestResult]
    steps: list[StepSample] = field(default_factory=list)  # shape and wall time of each step
    num_steps: int = 0
    peak_blocks: int = 0
    num_preemptions: int = 0
    max_running: int = 0
    duration_s: float = 0.0


def run_engine(engine: LLMEngine, workload: Workload) -> EngineRun:
    core = engine.core
    scheduler, manager = core.scheduler, core.block_manager
    run = EngineRun([])
    shapes = []
    schedule = scheduler.schedule

    def measured_schedule(*args, **kwargs):  # the batch as the planner sees it
        batch = schedule(*args, **kwargs)
        if not batch.empty:
            shapes.append(step_shape(batch))
            run.peak_blocks = max(run.peak_blocks, manager.num_blocks - manager.num_free_blocks)
            run.max_running = max(run.max_running, len(scheduler.running))
        return batch

    scheduler.schedule = measured_schedule
    preemptions_before, steps_before = scheduler.num_preemptions, core.num_steps
    pending = sorted(workload.initial(), key=lambda r: r.arrival_s)
    live: dict[str, tuple[PlannedRequest, RequestResult]] = {}
    start = time.perf_counter()
    try:
        while pending or engine.has_unfinished_requests():
            now = time.perf_counter() - start
            while pending and pending[0].arrival_s <= now:
                planned = pending.pop(0)
                result = RequestResult(planned.request_id, planned.arrival_s,
                                       len(planned.prompt_token_ids))
                run.requests.append(result)
                live[planned.request_id] = (planned, result)
                engine.add_request(planned.request_id, list(planned.prompt_token_ids), SamplingParams(
                    max_tokens=planned.output_len, ignore_eos=True, temperature=0.0,
                    detokenize=False, output_kind=RequestOutputKind.CUMULATIVE))
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, pending[0].arrival_s - now))
                continue
            shapes_before = len(shapes)
            began = time.perf_counter()
            outputs = engine.step()
            ended = time.perf_counter()
            if len(shapes) > shapes_before:
                run.steps.append(StepSample(shapes[-1], ended - began))
            t = ended - start
            for output in outputs:
                planned, result = live[output.request_id]
                tokens = output.outputs[0].token_ids
                for _ in range(len(tokens) - result.num_output_tokens):
                    result.add_token(t)
                result.num_output_tokens = len(tokens)
                if output.finished:
                    result.finished_s = t
                    result.num_cached_tokens = output.num_cached_tokens
                    del live[output.request_id]
                    follow = workload.follow_up(planned, list(tokens), t)
                    if follow is not None:
                        pending.append(follow)
                        pending.sort(key=lambda r: r.arrival_s)
    finally:
        scheduler.schedule = schedule
    run.num_steps = core.num_steps - steps_before
    run.num_preemptions = scheduler.num_preemptions - preemptions_before
    run.duration_s = time.perf_counter() - start
    return run


def calibrate(model: str, max_num_seqs: int, max_num_batched_tokens: int | None):
    """Step costs of the real engine on this machine: a short mixed run (12 prompts of 32 to
    384 tokens arriving over about 0.3 s, then their decodes) of `model`, fitted.
    ValueError naming the problem if the model cannot be loaded."""
    from kvdeck.app.plan.cost_model import FittedCostModel
    from kvdeck.app.plan.workload import Lengths, SyntheticWorkload
    from kvdeck.engine.types.config import EngineConfig

    engine = LLMEngine(EngineConfig(model=None if model == "demo" else model,
                                    max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens))
    try:
        info = engine.info
        workload = SyntheticWorkload(users=min(12, max_num_seqs * 2), prompt_len=Lengths(32, 384),
                                     output_len=Lengths(8, 32), vocab_size=info.vocab_size,
                                     max_model_len=info.max_model_len, rate=40.0, seed=0)
        run = run_engine(engine, workload)
    finally:
        engine.shutdown()
    return FittedCostModel.fit(run.steps[1:], f"a calibration run of {model} here")  # 1st: warm-up
