"""The gain policy (speculative_config {"method": "auto"}): it keeps the drafts whose expected
acceptance pays for their rows, turns speculation off on traces of poor acceptance and on
again on good ones, backs off as the batch grows, stays within the CPU decoder stack's rows,
and leaves greedy output as plain decoding's."""

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.core.spec.draft_budget import AcceptanceRecord, best_draft_lengths
from kvdeck.engine.core.spec.step_cost import MIN_SAMPLES, StepCostModel
from kvdeck.engine.types.speculative import SpeculativeConfig
from tests.engine.spec.test_spec_greedy import PROMPTS, _generate
from tests.model_factory import build_tiny_model

AUTO = {"speculative_config": {"method": "auto", "num_speculative_tokens": 6}}


def _linear(slope: float):
    return lambda rows: 1.0 + slope * (rows - 1)


def test_auto_is_suffix_decoding_under_the_gain_policy():
    config = SpeculativeConfig.from_dict({"method": "auto"})
    assert config.uses_suffix_trees and config.draft_policy == "gain"
    ngram = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert ngram.draft_policy == "fixed"
    with pytest.raises(ValueError, match="draft_policy must be one of"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "draft_policy": "x"})


def test_sure_drafts_are_kept_and_doubtful_ones_dropped():
    cost = _linear(0.125)
    lengths, speedup = best_draft_lengths([[0.95, 0.9, 0.85, 0.8]], 1, cost)
    assert lengths == [4] and speedup > 2.0
    # At 10% each row costs more than its expected token brings.
    lengths, speedup = best_draft_lengths([[0.1, 0.01]], 1, cost)
    assert lengths == [0] and speedup == 1.0
    # A long draft is cut where the cumulative chance falls below the row's price.
    lengths, _ = best_draft_lengths([[0.9, 0.6, 0.2, 0.05]], 1, cost)
    assert lengths == [2]


def test_the_batch_size_turns_it_off():
    """Where rows cost in proportion (a large batch on compute), no draft pays."""
    assert best_draft_lengths([[0.6, 0.36]], 1, _linear(0.125))[0] == [2]
    offers = [[0.6, 0.36]] * 4
    assert best_draft_lengths(offers, 4, _linear(0.125))[0] == [1, 1, 1, 1]
    offers = [[0.6, 0.36]] * 64
    assert best_draft_lengths(offers, 64, _linear(1.0))[0] == [0] * 64


def test_the_best_drafts_of_the_batch_go_first_within_the_row_limit():
    lengths, _ = best_draft_lengths([[0.5, 0.25], [0.99, 0.98, 0.97]], 2, _linear(0.05), max_rows=5)
    assert lengths == [0, 3]


def test_a_trace_of_rejections_turns_it_off_and_acceptances_on():
    record = AcceptanceRecord()
    cost = _linear(0.125)
    assert best_draft_lengths([record.acceptance(4, None)], 1, cost)[0] == [2]  # the prior: 50%, 25%, ...
    for _ in range(8):
        record.verifies.append((4, 0, 1.0))
    assert best_draft_lengths([record.acceptance(4, None)], 1, cost)[0] == [0]
    for _ in range(8):
        record.verifies.append((4, 4, 1.0))
    assert best_draft_lengths([record.acceptance(4, None)], 1, cost)[0] == [4]


def test_proposer_estimates_are_scaled_by_how_well_they_held():
    record = AcceptanceRecord()
    for _ in range(8):
        record.verifies.append((4, 1, 3.0))  # it predicted 3 accepted, 1 was
    offer = record.acceptance(4, [0.9, 0.8, 0.7, 0.6])
    assert offer == pytest.approx([0.9 * 10 / 26, 0.8 * 10 / 26, 0.7 * 10 / 26, 0.6 * 10 / 26])
    assert record.acceptance(3, [0.5, 0.9, 0.2]) == pytest.approx([c * 10 / 26 for c in (0.5, 0.5, 0.2)])


def test_the_step_cost_is_learned_and_never_falls_with_rows():
    model = StepCostModel()
    assert model.cost(5) == pytest.approx(1.5)  # the prior, in one-row steps
    for _ in range(MIN_SAMPLES):
        model.observe(1, 0.010)
        model.observe(4, 0.009)  # noise: a bigger step measured cheaper
    assert model.cost(1) == pytest.approx(0.010)
    assert model.cost(4) == pytest.approx(0.010)
    assert model.cost(8) == pytest.approx(0.009 * (1 + 0.125 * 7) / (1 + 0.125 * 3))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_output_is_plain_greedy_and_the_decision_is_reported(tiny_model_dirs, family):
    plain, _ = _generate(tiny_model_dirs[family], {}, kv_cache_memory_gib=0.01)
    got, stats = _generate(tiny_model_dirs[family], AUTO, rounds=2, kv_cache_memory_gib=0.01)
    assert got == plain
    assert stats.spec.method == "auto" and stats.spec.draft_policy == "gain"
    assert stats.spec.num_accepted_tokens > 0  # the second round's drafts from cached outputs


def test_requests_report_what_the_policy_decided(tiny_model_dirs):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    decisions = []
    with LLM(str(tiny_model_dirs["llama"]), kv_cache_memory_gib=0.01, **AUTO) as llm:
        decoder = llm.engine.core.spec
        forget = decoder.forget

        def forget_noting_the_decision(request_id: str) -> None:
            decisions.append(decoder.request_stats(request_id).decision)
            forget(request_id)

        decoder.forget = forget_noting_the_decision
        llm.generate(PROMPTS[:2], params)
        llm.generate(PROMPTS[:2], params)  # drafts from the first round's cached outputs
    assert len(decisions) == 4 and all(decisions), decisions
    assert any(d.startswith("verifying") for d in decisions[2:]), decisions


def test_auto_stays_off_where_speculation_cannot_run(tmp_path):
    """A LongRoPE model (Phi-3) cannot speculate: asked for, that is an error; by default
    ("auto", the TUI's), the engine starts without it."""
    model_dir = build_tiny_model(tmp_path / "phi3", "phi3")
    with LLM(str(model_dir), kv_cache_memory_gib=0.01, **AUTO) as llm:
        assert llm.engine.core.spec is None and llm.engine.core.scheduler is not None
        (out,) = llm.generate(["Hi"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        assert len(out.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="LongRoPE"):
        LLM(str(model_dir), kv_cache_memory_gib=0.01,
            speculative_config={"method": "suffix", "num_speculative_tokens": 4})
