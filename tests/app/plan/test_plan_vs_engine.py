"""The planner against the real engine on the demo model (the planner's target): on the same
synthetic workload (multi-turn conversations with a shared system prompt, a pool small enough
to preempt), the simulation's peak KV blocks and preemptions equal the engine's, and its step
count is within 5% (it is equal: the scheduler is the engine's own)."""

import pytest

from kvdeck.app.bench.plan_check import run_engine
from kvdeck.app.plan.choices import EngineChoice, engine_default_preemption
from kvdeck.app.plan.cost_model import FittedCostModel
from kvdeck.app.plan.simulate import simulate
from kvdeck.app.plan.workload import Lengths, SyntheticWorkload
from kvdeck.engine.api.llm_engine import LLMEngine
from kvdeck.engine.types.config import EngineConfig

MODES = ["default"] + (["recompute"] if "preemption_mode" in EngineConfig.field_names() else [])


def _workload(vocab_size: int, max_model_len: int) -> SyntheticWorkload:
    return SyntheticWorkload(users=10, prompt_len=Lengths(60, 140), output_len=Lengths(16, 48),
                             vocab_size=vocab_size, max_model_len=max_model_len, turns=2,
                             turn_len=Lengths(20, 40), shared_prefix=32, seed=1)


@pytest.mark.parametrize("mode", MODES)
def test_planner_matches_engine_blocks_preemptions_and_steps(mode):
    extra = {} if mode == "default" else {"preemption_mode": mode}
    engine = LLMEngine(EngineConfig(model=None, num_gpu_blocks_override=40, max_num_seqs=8,
                                    max_num_batched_tokens=256, **extra))
    try:
        info = engine.info
        run = run_engine(engine, _workload(info.vocab_size, info.max_model_len))
    finally:
        engine.shutdown()
    assert run.num_preemptions > 0  # the pool is small enough to matter
    choice = EngineChoice("base", info.num_blocks, info.block_size, 8, 256, info.max_model_len,
                          True, preemption_mode=extra.get("preemption_mode", engine_default_preemption()),
                          block_bytes=info.kv_bytes_per_block)
    cost = FittedCostModel.fit(run.steps, "the engine run")
    sim = simulate(_workload(info.vocab_size, info.max_model_len), choice, cost, info.vocab_size)
    assert sim.peak_blocks == run.peak_blocks
    assert sim.num_preemptions == run.num_preemptions
    assert sim.max_running == run.max_running
    assert abs(sim.num_steps - run.num_steps) <= 0.05 * run.num_steps
    assert [r.num_output_tokens for r in sim.requests] == [r.num_output_tokens for r in run.requests]
