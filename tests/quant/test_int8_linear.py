"""Weight-only INT8 (`quantization="int8"`, quantised at load time) and the bf16 packed
weights of the dense method on CPU (kernels/cpu/linear.py)."""

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner import compiled_forward
from kvdeck.engine.runner.models.linear import Linear, get_linear_method
from kvdeck.kernels.cpu.linear import (
    INT8_GEMV_MAX_ROWS,
    bf16_packing_supported,
    int8_linear,
    quantize_int8,
)
from kvdeck.quant.int8_linear import Int8LinearMethod, Int8OutputHead


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_quantize_int8_rounds_each_channel_to_half_a_step():
    weight = _weight(96, 128)
    weight[3] = 0.0  # an all-zero channel must not divide by zero
    qweight, scales = quantize_int8(weight)
    assert qweight.dtype == torch.int8 and scales.shape == (96,)
    assert qweight.abs().max() <= 127
    error = (qweight.float() * scales[:, None] - weight).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-7).all())
    assert bool((qweight[3] == 0).all())


@pytest.mark.parametrize("rows", [1, INT8_GEMV_MAX_ROWS, 3 * INT8_GEMV_MAX_ROWS])  # both kernels
def test_int8_linear_matches_the_dequantised_product(rows):
    weight, bias = _weight(96, 128), _weight(1, 96, seed=1)[0]
    qweight, scales = quantize_int8(weight)
    x = _weight(rows, 128, seed=2)
    out = int8_linear(x, qweight, scales.to(torch.bfloat16), bias)
    reference = x @ (qweight.float() * scales.to(torch.bfloat16).float()[:, None]).T + bias
    assert out.dtype == x.dtype and out.shape == (rows, 96)
    # bf16 activations: about 3 significant digits.
    assert torch.allclose(out, reference, rtol=2e-2, atol=2e-3)


def test_int8_layer_quantises_its_merged_shards_at_load_time():
    layer = Linear(128, [64, 32], False, get_linear_method("int8", {}), torch.float32)
    shards = [_weight(64, 128, seed=3), _weight(32, 128, seed=4)]
    for index, shard in enumerate(shards):
        layer.load_weight("weight", shard, index)
    layer.method.process_weights_after_loading(layer)
    assert not hasattr(layer, "weight") and layer.qweight.dtype == torch.int8
    x = _weight(2, 128, seed=5)
    assert torch.allclose(layer(x), x @ torch.cat(shards).T, rtol=5e-2, atol=5e-3)
    with pytest.raises(ValueError, match="already quantised"):
        layer.load_weight("weight", shards[0], 0)
    with pytest.raises(ValueError, match="unexpected parameter"):
        Linear(128, [64], False, Int8LinearMethod(), torch.float32).load_weight("qweight", shards[0], None)


def test_int8_output_head_is_close_to_the_dense_projection():
    weight = _weight(400, 64, seed=6)
    hidden = _weight(3, 64, seed=7)
    assert torch.allclose(Int8OutputHead(weight)(hidden), hidden @ weight.T, rtol=5e-2, atol=5e-3)


def _greedy(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_int8_engine_decodes_eagerly_and_compiled_alike(tiny_llama_dir, monkeypatch):
    """The whole model in int8 (output head too), eager and through the compiled decode
    graph (traced by aot_eager here; tests/engine/test_compiled_decode.py runs inductor):
    the same greedy tokens; and its first token is the fp32 model's."""
    monkeypatch.setattr(compiled_forward, "COMPILE_BACKEND", "aot_eager")
    options = dict(kv_cache_memory_gib=0.01, max_num_seqs=2)
    fp32 = LLM(str(tiny_llama_dir), **options)
    eager = LLM(str(tiny_llama_dir), quantization="int8", **options)
    compiled = LLM(str(tiny_llama_dir), quantization="int8", compile_decode=True, **options)
    assert isinstance(eager.engine.core.runner.model.lm_head, Int8OutputHead)
    tok = eager.get_tokenizer()
    prompts = [tok.encode("The quick brown fox"), tok.encode("Paged attention")]
    tokens = _greedy(eager, prompts, 6)
    assert _greedy(compiled, prompts, 6) == tokens
    assert compiled.engine.core.runner.decode_graphs.checked == {2}
    assert [t[0] for t in tokens] == [t[0] for t in _greedy(fp32, prompts, 1)]


@pytest.mark.skipif(not bf16_packing_supported(), reason="this CPU has no native bf16 matmul")
def test_bf16_weights_are_packed_for_onednn_and_give_the_dense_product():
    layer = Linear(128, [96], True, get_linear_method(None, None), torch.bfloat16)
    weight = _weight(96, 128, seed=8).to(torch.bfloat16)
    layer.load_weight("weight", weight, None)
    layer.load_weight("bias", _weight(1, 96, seed=9)[0].to(torch.bfloat16), None)
    layer.method.process_weights_after_loading(layer)
    assert layer.weight.is_mkldnn and layer.packed_number is not None
    for rows in (1, 5):
        x = _weight(rows, 128, seed=10).to(torch.bfloat16)
        dense = torch.nn.functional.linear(x.float(), weight.float(), layer.bias.float())
        assert torch.allclose(layer(x).float(), dense, rtol=2e-2, atol=2e-2)
