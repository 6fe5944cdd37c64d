"""Our AWQ against plain round-to-nearest INT4 (same group size) on a small trained model."""

import copy

import pytest
import torch

from kvdeck.quant.awq_quantizer import AWQSettings, QuantizeProgress, quantize_awq
from kvdeck.quant.calibration import windows_from_ids
from kvdeck.quant.packing import fake_quantize
from kvdeck.quant.perplexity import hf_logits_fn, perplexity
from tests.quant.trained_model import byte_ids, plant_outlier_channels, trained_model

GROUP = 32  # the tiny model's hidden size is 64: two groups per row
# Stated margin: AWQ's held-out perplexity within 3% of the fp model's.
FP_MARGIN = 1.03


@pytest.fixture(scope="module")
def model_with_outliers(request, tmp_path_factory):
    # Reuse the trained weights across local runs (pytest's cache); CI trains afresh.
    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("kvdeck-quant") if cache else tmp_path_factory.mktemp("trained")
    model = trained_model(cache_dir)
    plant_outlier_channels(model)
    return model


def _held_out_ppl(model) -> float:
    _, held = byte_ids()
    return perplexity(hf_logits_fn(model), held[:2048], seq_len=256).perplexity


def _round_to_nearest(model):
    rtn = copy.deepcopy(model)
    with torch.no_grad():
        for layer in rtn.model.layers:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.data = fake_quantize(module.weight.data, GROUP)
    return rtn


def test_awq_beats_round_to_nearest_and_stays_near_fp(model_with_outliers):
    fp_ppl = _held_out_ppl(model_with_outliers)
    rtn_ppl = _held_out_ppl(_round_to_nearest(model_with_outliers))
    train, _ = byte_ids()
    calibration = windows_from_ids(train, num_samples=8, seq_len=128)
    awq_model = copy.deepcopy(model_with_outliers)
    events: list[QuantizeProgress] = []
    packed = quantize_awq(awq_model, calibration, AWQSettings(group_size=GROUP), "cpu",
                          events.append)
    awq_ppl = _held_out_ppl(awq_model)
    print(f"held-out perplexity: fp {fp_ppl:.3f}  rtn {rtn_ppl:.3f}  awq {awq_ppl:.3f}")
    assert awq_ppl < rtn_ppl
    assert awq_ppl < fp_ppl * FP_MARGIN
    # AWQ recovers most of what round-to-nearest lost.
    assert (awq_ppl - fp_ppl) < 0.5 * (rtn_ppl - fp_ppl)
    assert [e.layer for e in events] == [1, 2] and events[-1].num_layers == 2
    assert events[-1].eta_s == 0.0 and events[0].elapsed_s <= events[1].elapsed_s
    assert set(packed) == {
        f"model.layers.{i}.{name}.{part}"
        for i in range(2)
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        for part in ("qweight", "qzeros", "scales")
    }


def test_the_fast_search_keeps_the_full_searchs_quality(model_with_outliers):
    """The scale search on a subsample of the calibration set, in bf16 where the CPU has it,
    against the search on all of it in fp32 (the implementation before): the same held-out
    perplexity within 2%, both below round-to-nearest's."""
    train, _ = byte_ids()
    calibration = windows_from_ids(train, num_samples=32, seq_len=128)
    results = {}
    variants = {"fast": AWQSettings(group_size=GROUP, search_samples=8),
                "full": AWQSettings(group_size=GROUP, search_samples=32, search_in_bf16=False)}
    for name, settings in variants.items():
        model = copy.deepcopy(model_with_outliers)
        quantize_awq(model, calibration, settings, "cpu")
        results[name] = _held_out_ppl(model)
    rtn_ppl = _held_out_ppl(_round_to_nearest(model_with_outliers))
    print(f"held-out perplexity: {results}, rtn {rtn_ppl:.3f}")
    assert abs(results["fast"] / results["full"] - 1) < 0.02
    assert results["fast"] < rtn_ppl and results["full"] < rtn_ppl


def _demo_model_dir():
    from kvdeck.engine.types.model_path import demo_model_dir

    files = ("config.json", "model.safetensors", "heldout.txt")
    return demo_model_dir() if all((demo_model_dir() / f).is_file() for f in files) else None


@pytest.mark.skipif(_demo_model_dir() is None, reason="the bundled demo model is not built yet")
def test_awq_on_the_demo_model_beats_round_to_nearest():
    """The bundled demo model (trained on stdlib docs), group 128 as in our checkpoints,
    calibrated on assets/calibration and scored on the demo's held-out modules.

    Where 4-bit costs this small model little, held-out perplexities of fp, RTN and AWQ
    differ by noise (a 60-step model gave 510.1 / 510.1 / 510.3), so the comparison with
    RTN is made on the KL divergence from the fp model's next-token distribution, which
    AWQ's objective targets (the same model: RTN 4.5e-4, AWQ 2.4e-4)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvdeck.quant.calibration import load_calibration_ids

    model_dir = _demo_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    text = (model_dir / "heldout.txt").read_text()
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
    windows = ids[: min(ids.numel() // 256, 8) * 256].reshape(-1, 256)
    assert windows.shape[0] >= 2, "heldout.txt is too short to score"

    with torch.no_grad():
        reference = torch.log_softmax(model(windows).logits.float(), dim=-1)

    def scores(m) -> tuple[float, float]:
        with torch.no_grad():
            logp = torch.log_softmax(m(windows).logits.float(), dim=-1)
        kl = (reference.exp() * (reference - logp)).sum(-1).mean()
        nll = -logp[:, :-1].gather(-1, windows[:, 1:, None]).mean()
        return float(kl), float(nll.exp())

    _, fp_ppl = scores(model)
    rtn = copy.deepcopy(model)
    with torch.no_grad():
        for layer in rtn.model.layers:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.data = fake_quantize(module.weight.data, 128)
    rtn_kl, rtn_ppl = scores(rtn)
    calibration = load_calibration_ids(tokenizer, num_samples=4, seq_len=256)
    quantize_awq(model, calibration, AWQSettings(group_size=128), "cpu")
    awq_kl, awq_ppl = scores(model)
    print(f"demo held-out: perplexity fp {fp_ppl:.3f} rtn {rtn_ppl:.3f} awq {awq_ppl:.3f}; "
          f"KL to fp rtn {rtn_kl:.2e} awq {awq_kl:.2e}")
    assert awq_kl < rtn_kl
    assert awq_ppl < fp_ppl * FP_MARGIN
