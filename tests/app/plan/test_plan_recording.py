"""`kvdeck plan FILE` on a recording of the real engine (the demo model, in-process, recorded
through app.record's writer as the server's recorder writes them: every step's tokens and
held blocks, a snapshot every step or every few): the workload comes back from the file, the
step costs are fitted to its steps, and the prediction's block peak and preemptions equal the
recorded ones (everything arrives at once, so the batches do not depend on time)."""

import time

import pytest

from kvdeck.app.plan.planner import PlanOptions, plan
from kvdeck.app.plan.recording import load_session
from kvdeck.app.plan.workload import Lengths, SyntheticWorkload
from kvdeck.app.record.session import engine_description, finished_payload
from kvdeck.app.record.writer import RecordingWriter
from kvdeck.engine.api.llm_engine import LLMEngine
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.sampling_params import SamplingParams


def _record(path, snapshot_every: int = 1, stagger: int = 0) -> tuple[SyntheticWorkload, dict]:
    """`stagger`: request i joins before engine step i * stagger (else all at once)."""
    engine = LLMEngine(EngineConfig(model=None, num_gpu_blocks_override=40, max_num_seqs=8,
                                    max_num_batched_tokens=256))
    workload = SyntheticWorkload(users=12, prompt_len=Lengths(60, 160), output_len=Lengths(16, 40),
                                 vocab_size=engine.info.vocab_size, max_model_len=engine.info.max_model_len,
                                 shared_prefix=32, seed=3)
    writer = RecordingWriter(path, engine_description(engine, "demo"))
    peak = 0
    waiting = workload.initial()
    try:
        while waiting or engine.has_unfinished_requests():
            while waiting and engine.core.num_steps >= stagger * (12 - len(waiting)):
                request = waiting.pop(0)
                engine.add_request(request.request_id, request.prompt_token_ids,
                                   SamplingParams(max_tokens=request.output_len, ignore_eos=True,
                                                  temperature=0.0, detokenize=False))
            outputs = engine.step()
            pool = engine.core.block_manager
            held = pool.num_blocks - pool.num_free_blocks
            peak = max(peak, held)
            writer.add_steps(time.time(), [1], engine.core.num_steps, [held])
            if engine.core.num_steps % snapshot_every == 0 or not engine.has_unfinished_requests():
                writer.add_stats(engine.stats())
            for output in outputs:
                if output.finished:
                    writer.add_finished(time.time(), finished_payload(output))
        core = engine.core
        recorded = {"preemptions": core.scheduler.num_preemptions, "steps": core.num_steps,
                    "peak": peak}
    finally:
        writer.close()
        engine.shutdown()
    return workload, recorded


@pytest.mark.parametrize("snapshot_every", [1, 7])
def test_plan_replays_a_recording_of_the_real_engine(tmp_path, snapshot_every):
    """Every 7th step snapshotted: the peak comes from the step records, as exact."""
    path = tmp_path / "session.kvrec"
    workload, recorded = _record(path, snapshot_every)
    assert recorded["preemptions"] > 0

    session = load_session(str(path))
    assert session.every_step and session.peak_blocks == recorded["peak"]
    replayed = {r.request_id: r for r in session.workload.requests}
    for request in workload.initial():  # lengths exact, arrivals within the recording's clock
        got = replayed[request.request_id]
        assert (len(got.prompt_token_ids), got.output_len) == \
            (len(request.prompt_token_ids), request.output_len)
        assert got.arrival_s < 0.5
    assert session.cost_model.num_samples > 10

    report = plan(PlanOptions(recording=str(path), tries=["num_blocks=80", "block_size=32"]))
    by_name = {c.name: c for c in report.comparisons}
    assert by_name["preemptions"].predicted == recorded["preemptions"]
    assert by_name["steps"].predicted == recorded["steps"]
    # The pool after every step and each request's first step recorded: replayed with the
    # engine's batches, the peak is exact; the prediction in time is reported beside it.
    assert "peak KV blocks, by time" in by_name and by_name["preemptions"].ok
    assert by_name["peak KV blocks"].predicted == by_name["peak KV blocks"].recorded == recorded["peak"]
    assert by_name["peak KV blocks"].ok
    assert report.summaries[1].preemptions == 0  # twice the pool: nobody is preempted
    assert report.summaries[2].num_blocks == 20  # the same memory in blocks twice as large


def test_a_recording_replayed_by_step_has_the_engine_batches_whatever_the_clock(tmp_path):
    """Requests that joined a few steps apart (within milliseconds of each other in time):
    replayed at their recorded first steps, the simulated pool's peak and steps are the
    engine's exactly."""
    path = tmp_path / "staggered.kvrec"
    _, recorded = _record(path, snapshot_every=5, stagger=3)
    report = plan(PlanOptions(recording=str(path)))
    by_name = {c.name: c for c in report.comparisons}
    assert by_name["peak KV blocks"].recorded == recorded["peak"]
    assert by_name["peak KV blocks"].predicted == recorded["peak"]
    assert by_name["steps"].predicted == recorded["steps"]
    assert by_name["preemptions"].predicted == recorded["preemptions"]


def test_what_the_recording_cannot_check_is_shown_not_judged(tmp_path):
    """A CPU recording planned for a named card: its timings are another machine's and its
    pool is sized from the card, so no row says ok or MISS, and the notes say why. Without
    the card the same rows are judged."""
    path = tmp_path / "cpu.kvrec"
    _record(path, snapshot_every=5)
    alone = plan(PlanOptions(recording=str(path)))
    assert all(c.tolerance is not None for c in alone.comparisons if c.name in (
        "TTFT p50 (s)", "ITL p50 (s)", "peak KV blocks", "steps"))
    on_card = plan(PlanOptions(recording=str(path), gpu="RTX 4090"))
    assert [c.name for c in on_card.comparisons][:2] == ["TTFT p50 (s)", "ITL p50 (s)"]
    assert all(c.tolerance is None and c.ok is None for c in on_card.comparisons)
    notes = " | ".join(on_card.notes)
    assert "predicted for the RTX 4090 and were recorded on cpu: shown, not judged" in notes
    assert "not the recorded engine's" in notes
