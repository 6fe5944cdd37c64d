"""The quantise dialog's choices and estimate: group sizes as the quantiser rules them (without
torch), the probe's figures scaled to the whole job, and the probe itself on the tiny model."""

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from kvdeck.app.jobs import quantize_estimate
from kvdeck.app.jobs.quantize import QuantizeOptions
from kvdeck.app.jobs.quantize_estimate import (
    CONFIRM_ABOVE_S,
    PERPLEXITY_OVER_BF16,
    QuantizeChoices,
    QuantizeEstimate,
    check_config,
    estimate_from_figures,
    format_estimate,
    group_size_problem,
    group_sizes,
    quality_note,
    quantize_choices,
    start_probe,
)
from kvdeck.app.store import local_models, paths

pytestmark = pytest.mark.timeout(180)

SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64}
CONFIGS = [
    SMOLLM2,
    {**SMOLLM2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": None},
    {**SMOLLM2, "hidden_size": 96, "intermediate_size": 288, "num_attention_heads": 3, "head_dim": 32},
    {**SMOLLM2, "hidden_size": 100, "intermediate_size": 300, "num_attention_heads": 4, "head_dim": 25},
    {**SMOLLM2, "num_key_value_heads": 1, "head_dim": 36, "num_attention_heads": 16},  # kv 36: not x8
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"h{c['hidden_size']}-kv{c['num_key_value_heads']}")
def test_group_sizes_follow_the_quantisers_rule(config):
    from types import SimpleNamespace

    from kvdeck.quant.awq_quantizer import GROUP_SIZES, check_group_divisibility, default_group_size

    hf = SimpleNamespace(**config)
    fits = []
    for size in GROUP_SIZES:
        try:
            check_group_divisibility(hf, size)
            fits.append(size)
            assert group_size_problem(config, size) is None
        except ValueError as exc:
            assert group_size_problem(config, size) is not None, exc
    assert group_sizes(config) == fits
    if fits:  # the dialog's default is the quantiser's
        assert fits[0] == default_group_size(hf)
    assert group_sizes(SMOLLM2) == [64, 32]  # 576 = 4.5 x 128


def test_the_light_constants_match_the_quantisers():
    from kvdeck.quant import awq_pipeline, awq_quantizer

    assert quantize_estimate.GROUP_SIZES == awq_quantizer.GROUP_SIZES
    assert quantize_estimate.SUPPORTED_MODEL_TYPES == awq_quantizer.SUPPORTED_MODEL_TYPES
    from kvdeck.app.jobs.quantize import METHODS

    assert METHODS == awq_pipeline.METHODS


def test_check_config_refuses_what_the_quantiser_would():
    check_config(SMOLLM2)
    with pytest.raises(ValueError, match="not 'gemma2'"):
        check_config({**SMOLLM2, "model_type": "gemma2"})
    with pytest.raises(ValueError, match="no INT4 group size"):
        check_config(CONFIGS[3])


def test_the_quality_trade_off_is_the_committed_benchmarks():
    """The dialog's perplexity figures are benchmarks/results/quality_smollm2_cpu.json's."""
    results = Path(__file__).parents[2] / "benchmarks" / "results" / "quality_smollm2_cpu.json"
    measured = json.loads(results.read_text())
    for method, ratio in PERPLEXITY_OVER_BF16.items():
        assert ratio == pytest.approx(measured[method]["vs_bf16"], abs=5e-4), method
    assert PERPLEXITY_OVER_BF16["awq"] < PERPLEXITY_OVER_BF16["rtn"]  # AWQ: the better one
    assert quality_note() == ("Quality on SmolLM2-135M-Instruct: held-out perplexity +15% with AWQ, "
                              "+37% with RTN, over bf16.")


def test_the_choices_offered_for_a_model(tiny):
    import dataclasses

    assert quantize_choices(tiny) == QuantizeChoices([128, 64, 32], "")
    config_path = tiny.path / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "hidden_size": 96, "intermediate_size": 192,
                                       "num_attention_heads": 2}))
    assert quantize_choices(tiny) == QuantizeChoices(
        [32], "Not offered: 128: hidden_size = 96 is not divisible by 128; "
              "64: hidden_size = 96 is not divisible by 64.")
    config_path.write_text(json.dumps({**config, "model_type": "gemma2"}))
    with pytest.raises(ValueError, match="^tiny-llama: kvdeck quantises llama, .* not 'gemma2'"):
        quantize_choices(tiny)
    config_path.write_text("{not json")
    with pytest.raises(ValueError, match="^tiny-llama: .*config.json: not valid JSON"):
        quantize_choices(tiny)
    with pytest.raises(ValueError, match="already quantised"):
        quantize_choices(dataclasses.replace(tiny, quantization="awq-int4"))


def test_the_estimate_scales_the_probe_to_the_whole_job():
    figures = {"layers": 30, "load_one_layer_s": 1.0, "one_layer_params": 30, "params": 120,
               "rtn_first_layer_s": 0.5, "rtn_layer_s": 0.1, "worker_s": 2.0}
    rtn_only = estimate_from_figures(figures, startup_s=3.0)
    assert rtn_only.awq is None
    # start-up 3 + loading 4x the first layer's 1 s + first use 0.4 + 30 layers x 0.1 s
    assert rtn_only.rtn.seconds == pytest.approx(3 + 4 + 0.4 + 3)
    figures.update({"tokenize_s": 0.5, "calibration_samples": 128, "awq_layer_s": 10.0,
                    "awq_record_s": 1.0, "write_one_layer_s": 0.2, "checkpoint_bytes": 600,
                    "one_layer_checkpoint_bytes": 200})
    both = estimate_from_figures(figures, startup_s=3.0)
    # start-up, loading, writing 3x the first layer's checkpoint, tokenising, 30 layers x 10 s
    assert both.awq.seconds == pytest.approx(3 + 4 + 0.6 + 0.5 + 30 * 10)
    assert both.rtn.seconds == pytest.approx(3 + 4 + 0.4 + 3 + 0.6)
    assert both.awq.needs_confirmation and not both.rtn.needs_confirmation
    assert "128 calibration sequences" in both.awq.how and "30 layers" in both.awq.how
    assert both.get("awq") is both.awq and both.get("rtn") is both.rtn
    assert CONFIRM_ABOVE_S == 120


def test_format_estimate():
    assert [format_estimate(s) for s in (0.2, 8.4, 59, 61, 330, 5400, 6000)] == [
        "about 1 s", "about 8 s", "about 59 s", "about 1 min", "about 6 min", "about 1 h 30 min",
        "about 1 h 40 min"]


@pytest.fixture
def tiny(kvdeck_env, hub_model_dir):
    shutil.copytree(hub_model_dir, paths.store_dir() / "tiny-llama")
    return local_models.find_model("tiny-llama")


@pytest.mark.slow
def test_the_probe_times_the_quantiser_on_the_first_layer(tiny):
    estimates: list[QuantizeEstimate] = []
    steps: list[str] = []
    ended: list[str | None] = []
    done = threading.Event()
    options = QuantizeOptions(num_samples=32, seq_len=64, device="cpu", num_threads=1)
    started = time.monotonic()
    probe = start_probe(tiny, options, estimates.append, steps.append,
                        lambda error: (ended.append(error), done.set()))
    assert done.wait(150), "the probe did not end"
    assert ended == [None]
    assert estimates[0].awq is None and estimates[0].rtn is not None  # RTN's first
    final = estimates[-1]
    figures = final.figures
    assert figures["layers"] == 2 and figures["group_size"] == 128 and figures["device"] == "cpu"
    assert figures["calibration_samples"] == 32
    assert 0 < figures["awq_record_s"] < figures["awq_layer_s"]
    assert 0 < probe.startup_s < time.monotonic() - started
    assert final.rtn.seconds < final.awq.seconds < 150
    assert "recording the linears' inputs" in steps  # what the probe does, as the dialog shows it
    assert not probe.background.scratch.exists()  # the probe's checkpoint and log are gone


@pytest.mark.slow
def test_a_cancelled_probe_stops_and_says_nothing(tiny):
    first = threading.Event()
    ended: list[str | None] = []
    probe = start_probe(tiny, QuantizeOptions(device="cpu", num_threads=1), lambda e: first.set(),
                        on_end=ended.append)
    assert first.wait(120)
    probe.cancel()
    assert probe.background.done and probe.background.cancelled and not probe.background.process_alive
    assert ended == [] and not probe.background.scratch.exists()
