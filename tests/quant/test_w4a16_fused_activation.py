"""The MLP's gated activation in the W4A16 GEMM's epilogue: a gate | up layer repacked with
its columns paired (kernels/reference/w4a16_repack.py's `pair_halves`) gives act(gate) * up
from the fused kernel and its GEMV form (under TRITON_INTERPRET=1, set by tests/conftest.py)
as the activation kernel gives it from the plain product, through split-K and the large-M
path; the layer serves it with one launch fewer, KVDECK_FUSED_ACTIVATION=0 keeps the plain
layout, and a LoRA adapter's slots undo the pairing."""

import json
from dataclasses import replace

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.models.linear import Linear, get_linear_method
from kvdeck.kernels.reference.activation import GATED_ACTIVATIONS
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq
from kvdeck.kernels.reference.w4a16_repack import (
    dequantize_repacked,
    pair_halves,
    paired_order,
    repack_awq,
    unpack_repacked,
    unpair_halves,
    w4a16_gated_repacked_torch,
)
from kvdeck.quant.awq_linear import fused_activation_setting
from tests.kernel_launches import LaunchRecorder
from tests.model_factory import build_tiny_model
from tests.quant.awq_checkpoint import write_awq
from tests.quant.test_w4a16_marlin import _gptq_sym_layer_tensors, _random_awq

GROUP_SIZES = (32, 64, 128)
ACTIVATIONS = tuple(GATED_ACTIVATIONS)  # silu, gelu_tanh


def _layer(k: int, half: int, group: int, seed: int, symmetric: bool = False):
    qweight, qzeros, scales = _random_awq(k, 2 * half, group, torch.float16, seed, symmetric)
    return qweight, qzeros, scales, repack_awq(qweight, qzeros, scales, group)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", GROUP_SIZES)
def test_pairing_is_a_lossless_column_order(group, symmetric):
    half = 100  # 200 columns: the last tile padded
    qweight, qzeros, scales, plain = _layer(2 * group, half, group, group, symmetric)
    paired = pair_halves(plain)
    assert paired.paired and paired.qweight.shape == plain.qweight.shape
    # Stored column 2j is gate j, 2j + 1 is up j; the padding stays where it was.
    plain_q, paired_q = _stored_columns(plain), _stored_columns(paired)
    assert torch.equal(paired_q[:, 0::2][:, :half], plain_q[:, :half])
    assert torch.equal(paired_q[:, 1::2][:, :half], plain_q[:, half:2 * half])
    assert torch.equal(paired.scales[:, :2 * half], plain.scales[:, paired_order(2 * half)])
    assert not paired.scales[:, 2 * half:].any()
    # Every reader gives the layer's own order; unpairing restores the tensors bit for bit.
    assert all(torch.equal(a, b)
               for a, b in zip(unpack_repacked(paired), unpack_repacked(plain), strict=True))
    assert torch.equal(dequantize_repacked(paired), dequantize_awq(qweight, qzeros, scales, group))
    back = unpair_halves(paired)
    assert not back.paired
    assert torch.equal(back.qweight, plain.qweight) and torch.equal(back.scales, plain.scales)
    assert (back.zeros is None) == symmetric and (symmetric or torch.equal(back.zeros, plain.zeros))
    assert pair_halves(paired) is paired and unpair_halves(plain) is plain


def _stored_columns(w) -> torch.Tensor:
    tiles, packed_k, tile_n = w.qweight.shape
    return w.qweight.transpose(0, 1).reshape(packed_k, tiles * tile_n)


def test_pairing_wants_two_equal_halves():
    qweight, qzeros, scales = _random_awq(64, 72, 32, torch.float16, 1)
    odd = replace(repack_awq(qweight, qzeros, scales, 32), n=71)
    with pytest.raises(ValueError, match="two equal halves, got 71 columns"):
        pair_halves(odd)


def _configs(marlin, m: int, n: int, k: int, group: int):
    """The bucket's own config, split in two, swapped, and the GEMV form split in two."""
    base = marlin.config_for(m, n, k, group, torch.device("cpu"))
    base = replace(base, block_k=min(base.block_k, group))
    return {"bucket": base, "split": replace(base, split_k=2), "swap": replace(base, swap_ab=True),
            "gemv": replace(marlin.GEMV_CONFIG, block_k=min(marlin.GEMV_CONFIG.block_k, group), split_k=2)}


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_the_epilogue_applies_the_activation_kernels_arithmetic(marlin, m, symmetric, activation):
    from kvdeck.kernels.triton.activation import gated_activation_triton

    k, half, group = 256, 100, 64  # 200 columns: the last tile padded
    *_, plain = _layer(k, half, group, m, symmetric)
    paired = pair_halves(plain)
    x = torch.randn(m, k)
    for name, config in _configs(marlin, m, 2 * half, k, group).items():
        product = marlin.w4a16_matmul_marlin(x, plain, config=config)
        fused = marlin.w4a16_matmul_marlin(x, paired, config=config, activation=activation)
        unfused = gated_activation_triton(product, activation)
        assert fused.shape == (m, half) and fused.dtype == x.dtype
        # The paired weight without an activation stores the layer's own column order.
        unpaired_store = marlin.w4a16_matmul_marlin(x, paired, config=config)
        if config.gemv:  # plain fp32 sums: each column's the same whatever its place, bit for bit
            assert torch.equal(unpaired_store, product), name
            assert torch.equal(fused, unfused), name
        else:  # the interpreter's dot (numpy) may group a column's sums by its place
            torch.testing.assert_close(unpaired_store, product, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused, w4a16_gated_repacked_torch(x, plain, activation),
                                   rtol=2e-2, atol=2e-3)  # the reference rounds weights to fp16


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fp16_epilogue_rounds_the_product_before_the_activation(marlin, activation):
    # In fp16 the fused result is the activation of the product as a GEMM stores it (rounded
    # to fp16 first): the GEMV form gives the activation kernel's result bit for bit.
    from kvdeck.kernels.triton.activation import gated_activation_triton

    k, half, group = 128, 64, 32
    *_, plain = _layer(k, half, group, 5)
    paired = pair_halves(plain)
    x = torch.randn(2, k).half()
    config = _configs(marlin, 2, 2 * half, k, group)["gemv"]
    product = marlin.w4a16_matmul_marlin(x, plain, config=config)
    fused = marlin.w4a16_matmul_marlin(x, paired, config=config, activation=activation)
    assert fused.dtype == torch.float16
    assert torch.equal(fused, gated_activation_triton(product, activation))


def test_large_batches_dequantise_in_the_layers_order_then_activate(marlin):
    k, half, group = 128, 64, 32
    qweight, qzeros, scales, plain = _layer(k, half, group, 9)
    paired = pair_halves(plain)
    assert torch.equal(marlin.dequantize_marlin(paired), dequantize_awq(qweight, qzeros, scales, group))
    m = marlin.tuning(None).fused_max_tokens + 1  # past the fused GEMM: dequantise, then matmul
    x = torch.randn(m, k)
    torch.testing.assert_close(marlin.w4a16_gemm_marlin(x, paired, activation="silu"),
                               w4a16_gated_repacked_torch(x, plain, "silu"), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(marlin.w4a16_gemm_marlin(x, paired), marlin.w4a16_gemm_marlin(x, plain))


def test_bad_requests_name_the_problem(marlin):
    *_, plain = _layer(64, 32, 32, 2)
    paired = pair_halves(plain)
    x = torch.randn(1, 64)
    with pytest.raises(ValueError, match="paired"):
        marlin.w4a16_matmul_marlin(x, plain, activation="silu")
    with pytest.raises(ValueError, match="unknown gated activation 'relu'.*silu, gelu_tanh"):
        marlin.w4a16_matmul_marlin(x, paired, activation="relu")
    with pytest.raises(ValueError, match="takes no bias"):
        marlin.w4a16_matmul_marlin(x, paired, torch.zeros(64))


def _gated_layer(quant: str, k: int, half: int, group: int, environ_on: bool, monkeypatch):
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
    monkeypatch.setenv("KVDECK_FUSED_ACTIVATION", "1" if environ_on else "0")
    if quant == "awq":
        qweight, qzeros, scales = _random_awq(k, 2 * half, group, torch.float32, 4)
        tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
        dense = dequantize_awq(qweight, qzeros, scales, group)
        config = {"bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    else:
        qweight, qzeros, scales, g_idx, dense = _gptq_sym_layer_tensors(k, 2 * half, group, True, 4)
        tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales.float(), "g_idx": g_idx}
        dense = dense.float()
        config = {"bits": 4, "group_size": group, "desc_act": True, "sym": True}
    method = get_linear_method(quant, {**config, "w4a16_backend": "triton"})
    layer = Linear(k, [half, half], False, method, torch.float32, gated=True)
    for name, tensor in tensors.items():
        layer.load_weight(name, tensor, None)
    layer.method.process_weights_after_loading(layer)
    return layer, dense


@pytest.mark.parametrize("quant", ["awq", "gptq"])
def test_a_gated_layer_pairs_at_load_and_fuses(marlin, monkeypatch, quant):
    k, half, group = 128, 64, 32
    layer, dense = _gated_layer(quant, k, half, group, True, monkeypatch)
    assert layer.fuses_activation() and layer.repacked.paired
    x = torch.randn(3, k)
    expected = GATED_ACTIVATIONS["silu"](x @ dense)
    calls = []

    def unfused(product):
        calls.append(product)
        return GATED_ACTIVATIONS["silu"](product)

    torch.testing.assert_close(layer.act_and_mul(x, "silu", unfused), expected, rtol=1e-3, atol=1e-3)
    assert not calls  # the epilogue applied it
    # The plain product of the paired layer is in the layer's order (gate | up).
    torch.testing.assert_close(layer(x), x @ dense, rtol=1e-3, atol=1e-3)
    # A LoRA adapter's slots undo the pairing: the product is the unfused path's again.
    layer.attach_lora(object())
    assert not layer.fuses_activation() and not layer.repacked.paired
    assert layer.qweight is not None and layer.qweight.data_ptr() == layer.repacked.qweight.data_ptr()
    layer.lora = None
    torch.testing.assert_close(layer.act_and_mul(x, "silu", unfused), expected, rtol=1e-3, atol=1e-3)
    assert len(calls) == 1


def test_off_keeps_the_plain_layout(marlin, monkeypatch):
    layer, dense = _gated_layer("awq", 64, 32, 32, False, monkeypatch)
    assert not layer.fuses_activation() and not layer.repacked.paired
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer.act_and_mul(x, "silu", GATED_ACTIVATIONS["silu"]),
                               GATED_ACTIVATIONS["silu"](x @ dense), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False)])
def test_the_setting_is_on_unless_turned_off(value, on):
    assert fused_activation_setting({} if value is None else {"KVDECK_FUSED_ACTIVATION": value}) is on
    with pytest.raises(ValueError, match="KVDECK_FUSED_ACTIVATION"):
        fused_activation_setting({"KVDECK_FUSED_ACTIVATION": "yes"})


def test_a_bad_value_stops_any_int4_load(tmp_path, monkeypatch):
    # Also where no layer would be paired (the CPU's own INT4 path): the value is read at load.
    write_awq(build_tiny_model(tmp_path / "llama", "llama"), tmp_path / "awq")
    monkeypatch.setenv("KVDECK_FUSED_ACTIVATION", "on")
    with pytest.raises(ValueError, match="KVDECK_FUSED_ACTIVATION must be 0 or 1, got 'on'"):
        LLM(str(tmp_path / "awq"), device="cpu", dtype="float32", kv_cache_memory_gib=0.01,
            enforce_eager=True)


@pytest.fixture(scope="module", params=["llama", "gemma2"])  # SiLU; GeGLU's GELU(tanh)
def awq_model_dir(tmp_path_factory, request):
    """A tiny AWQ model whose INT4 layers run the Triton kernels (interpreted)."""
    root = tmp_path_factory.mktemp("fused-act")
    out = root / "awq"
    write_awq(build_tiny_model(root / request.param, request.param), out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["w4a16_backend"] = "triton"
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_the_engine_launches_no_activation_kernel_and_gives_the_same_tokens(marlin, awq_model_dir,
                                                                             monkeypatch):
    """The steps of a tiny AWQ model on the Triton path: with the fused epilogue no activation
    launch (one a layer and step without it), and the same greedy tokens."""
    from kvdeck.kernels.triton import launch as launch_module

    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = [[5, 9, 14, 3, 8, 21]]
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("KVDECK_FUSED_ACTIVATION", setting)
        with LLM(str(awq_model_dir), device="cpu", dtype="float32", attention_backend="triton",
                 kv_cache_memory_gib=0.01, max_num_seqs=2, enforce_eager=True, max_model_len=64) as llm:
            layers = llm.engine.core.runner.model.model.layers
            assert all(layer.mlp.gate_up_proj.fuses_activation() == (setting == "1") for layer in layers)
            llm.generate(prompt, SamplingParams(max_tokens=1))  # the variants compile
            recorder = LaunchRecorder(launch_module.COMPILES)
            monkeypatch.setattr(launch_module, "COMPILES", recorder)
            tokens = llm.generate(prompt, params)[0].outputs[0].token_ids
            monkeypatch.setattr(launch_module, "COMPILES", recorder.counter)
        steps = len(tokens)  # one prefill and len - 1 decode steps, each a forward
        activations = recorder.kernels.count("_act_and_mul_kernel")
        results[setting] = tokens
        assert activations == (0 if setting == "1" else steps * len(layers)), (setting, activations)
    assert results["1"] == results["0"]

