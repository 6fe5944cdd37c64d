"""The AWQ and bnb-nf4 linear methods behind kvdeck.engine.runner.models.linear.Linear."""

import pytest
import torch

from kvdeck.engine.runner.models.linear import Linear, get_linear_method
from kvdeck.engine.types.quantization import linear_method_names, make_linear_method
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq, quantize_activations_q8
from kvdeck.quant.awq_linear import AWQConfig, AWQLinearMethod
from kvdeck.quant.packing import pack_awq_weight

AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
              "version": "gemm"}


def test_engine_hook_returns_our_methods():
    assert linear_method_names() == ("awq", "gptq", "bnb-nf4", "int8")  # registered by kvdeck.quant
    assert isinstance(get_linear_method("awq", AWQ_CONFIG), AWQLinearMethod)
    assert type(get_linear_method("gptq", {"bits": 4})).__name__ == "GPTQLinearMethod"
    assert type(get_linear_method("bnb-nf4", {})).__name__ == "BnbNF4LinearMethod"
    with pytest.raises(ValueError, match="quantization must be one of"):
        make_linear_method("marlin", {})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bits": 8}, "bits must be 4"),
        ({"group_size": 100}, "group_size"),
        ({"zero_point": False}, "zero_point"),
        ({"version": "gemv"}, "version 'gemv' is not supported"),
    ],
)
def test_awq_config_refuses_variants_we_cannot_run(change, message):
    with pytest.raises(ValueError, match=message):
        AWQConfig.from_quant_config({**AWQ_CONFIG, **change})


def test_awq_layer_rejects_bad_shapes():
    method = get_linear_method("awq", AWQ_CONFIG)
    with pytest.raises(ValueError, match="not divisible by AWQ group_size"):
        Linear(96, [64], False, method, torch.float32)
    with pytest.raises(ValueError, match="multiple of 8"):
        Linear(128, [60, 4], False, method, torch.float32)


def test_merged_awq_layer_equals_its_shards():
    """qkv-style layer: three checkpoint shards packed separately, loaded side by side."""
    gen = torch.Generator().manual_seed(0)
    sizes = [64, 32, 32]
    weights = [torch.randn(n, 128, generator=gen) * 0.05 for n in sizes]
    layer = Linear(128, sizes, True, get_linear_method("awq", AWQ_CONFIG), torch.float32)
    bias = torch.randn(sum(sizes), generator=gen)
    dense = []
    for shard, weight in enumerate(weights):
        qweight, qzeros, scales = pack_awq_weight(weight, 64)
        layer.load_weight("qweight", qweight, shard)
        layer.load_weight("qzeros", qzeros, shard)
        layer.load_weight("scales", scales, shard)
        layer.load_weight("bias", bias[sum(sizes[:shard]):sum(sizes[:shard + 1])], shard)
        dense.append(dequantize_awq(qweight, qzeros, scales.float(), 64))
    layer.method.process_weights_after_loading(layer)
    x = torch.randn(5, 128, generator=gen)
    # On a CPU with the INT4 kernel its activations are int8 per block of 32 (its reference).
    activations = x if layer.int4 is None else _dequantized_q8(x)
    expected = activations @ torch.cat(dense, dim=1) + bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    # Leading dims are kept (transformers passes [batch, seq, hidden]).
    assert layer(x.reshape(1, 5, 128)).shape == (1, 5, 128)
    with pytest.raises(ValueError, match="unexpected parameter 'weight'"):
        layer.load_weight("weight", weights[0], 0)


def _dequantized_q8(x: torch.Tensor) -> torch.Tensor:
    x8, scales = quantize_activations_q8(x)
    return (x8.view(x.shape[0], -1, 32) * scales.unsqueeze(-1)).view(x.shape)


def test_awq_layer_with_random_int_weights_is_finite():
    # What load_format="dummy" produces: int32 over the whole range, small float scales.
    layer = Linear(128, [64], False, get_linear_method("awq", AWQ_CONFIG), torch.float32)
    gen = torch.Generator().manual_seed(1)
    for name in ("qweight", "qzeros"):
        param = getattr(layer, name)
        param.data = torch.randint(-(2**31), 2**31 - 1, param.shape, generator=gen,
                                   dtype=torch.int32)
    layer.scales.data.uniform_(-0.02, 0.02, generator=gen)
    assert bool(torch.isfinite(layer(torch.randn(3, 128))).all())


def test_bnb_nf4_layer_quantises_at_load_time():
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnbf

    gen = torch.Generator().manual_seed(2)
    sizes = [48, 80]
    weights = [torch.randn(n, 128, generator=gen) * 0.05 for n in sizes]
    layer = Linear(128, sizes, False, get_linear_method("bnb-nf4", {}), torch.float32)
    for shard, weight in enumerate(weights):
        layer.load_weight("weight", weight, shard)
    layer.method.process_weights_after_loading(layer)
    assert not hasattr(layer, "weight") and layer.nf4_weight.dtype == torch.uint8
    x = torch.randn(4, 128, generator=gen)
    dense = torch.cat(weights)
    out = layer(x)
    # NF4 is lossy: close to the dense product, and exactly the product with the
    # weight bitsandbytes itself dequantises.
    nf4 = bnbf.dequantize_4bit(*bnbf.quantize_4bit(dense, blocksize=64, quant_type="nf4"))
    torch.testing.assert_close(out, x @ nf4.t(), rtol=1e-5, atol=1e-5)
    assert float((out - x @ dense.t()).abs().max()) < 0.1 * float((x @ dense.t()).abs().max())
    with pytest.raises(ValueError, match="already quantised"):
        layer.load_weight("weight", weights[0], 0)


def test_engine_runs_bnb_nf4_like_transformers_with_nf4_weights(group128_llama_dir):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bnbf
    from transformers import AutoModelForCausalLM

    from kvdeck import LLM, SamplingParams

    prompt = [5, 6, 7, 8]
    reference = AutoModelForCausalLM.from_pretrained(group128_llama_dir, dtype=torch.float32)
    with torch.no_grad():
        for layer in reference.model.layers:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    # Rows are multiples of the 64-element block, so quantising the merged
                    # qkv/gate_up weight equals quantising each projection alone.
                    packed, state = bnbf.quantize_4bit(module.weight.data, blocksize=64,
                                                       quant_type="nf4")
                    module.weight.data = bnbf.dequantize_4bit(packed, state)
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                  eos_token_id=None)[0, len(prompt):].tolist()
    llm = LLM(model=str(group128_llama_dir), device="cpu", dtype="float32", max_model_len=64,
              quantization="bnb-nf4")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == expected
