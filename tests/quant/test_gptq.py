"""GPTQ checkpoints (AutoGPTQ's v1 layout, 4 bits, with and without act-order) load and run
through the AWQ layers' kernels: the engine generates what transformers generates with the
checkpoint's weights dequantised by an independent reading of the layout written here."""

import json

import pytest
import torch
from safetensors.torch import save_file

from kvdeck import LLM, SamplingParams
from kvdeck.kernels.cpu import int4 as cpu_int4
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq
from kvdeck.quant.gptq_linear import GPTQConfig, GPTQLinearMethod, to_awq
from tests.model_factory import build_tiny_model

GROUP = 32
PROMPT = [(7 * i) % 300 + 3 for i in range(30)]


def gptq_pack(weight: torch.Tensor, group: int, act_order: bool, seed: int = 0):
    """An independent GPTQ v1 writer: W [out, in] -> (qweight [in/8, out], qzeros [in/G, out/8]
    holding z - 1, scales [in/G, out] fp16, g_idx [in]) and the weight they stand for."""
    out_features, in_features = weight.shape
    order = torch.randperm(in_features, generator=torch.Generator().manual_seed(seed)) if act_order \
        else torch.arange(in_features)
    g_idx = torch.empty(in_features, dtype=torch.int32)
    g_idx[order] = (torch.arange(in_features) // group).to(torch.int32)  # act-order: groups by importance
    w = weight.float().t()  # [in, out]
    q = torch.empty(in_features, out_features, dtype=torch.int64)
    zeros = torch.empty(in_features // group, out_features, dtype=torch.int64)
    scales = torch.empty(in_features // group, out_features)
    for g in range(in_features // group):
        rows = (g_idx == g).nonzero().flatten()
        low, high = w[rows].amin(0), w[rows].amax(0)
        scale = ((high - low) / 15).clamp(min=1e-5).half().float()
        zero = torch.round(-low / scale).clamp(0, 15)
        q[rows] = (torch.round(w[rows] / scale) + zero).clamp(0, 15).long()
        zeros[g], scales[g] = zero.long(), scale
    dense = torch.stack([(q[k] - zeros[g_idx[k]]).float() * scales[g_idx[k]] for k in range(in_features)])
    qweight = torch.zeros(in_features // 8, out_features, dtype=torch.int64)
    for j in range(8):
        qweight |= q[j::8] << (4 * j)
    stored = (zeros - 1) & 0xF
    qzeros = torch.zeros(in_features // group, out_features // 8, dtype=torch.int64)
    for j in range(8):
        qzeros |= stored[:, j::8] << (4 * j)
    as_int32 = lambda t: torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)  # noqa: E731
    return as_int32(qweight), as_int32(qzeros), scales.half(), g_idx, dense.t()


@pytest.mark.parametrize("act_order", [False, True])
def test_the_conversion_keeps_the_weight(act_order):
    weight = torch.randn(48, 128)
    qweight, qzeros, scales, g_idx, dense = gptq_pack(weight, GROUP, act_order)
    awq_qweight, awq_qzeros, awq_scales, permutation = to_awq(qweight, qzeros, scales, g_idx, GROUP)
    converted = dequantize_awq(awq_qweight, awq_qzeros, awq_scales.float(), GROUP)  # [in, out], rows sorted
    assert (permutation is None) == (not act_order)
    rows = torch.arange(128) if permutation is None else permutation
    assert torch.equal(converted, dense.t()[rows])


def write_gptq(dense_dir, out_dir, act_order: bool):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()
    out_dir.mkdir()
    tensors, state = {}, {}
    for name, tensor in model.state_dict().items():
        module = name.rpartition(".")[0]
        if ".layers." in name and name.endswith("proj.weight"):
            # Act-order follows the input's statistics: the layers reading one input share it.
            layer = int(name.split(".layers.")[1].split(".")[0])
            seed = 1000 * layer + tensor.shape[1]
            qweight, qzeros, scales, g_idx, dense = gptq_pack(tensor, GROUP, act_order, seed=seed)
            tensors |= {f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales,
                        f"{module}.g_idx": g_idx}
            state[name] = dense
        elif name != "lm_head.weight" or not model.config.tie_word_embeddings:
            tensors[name] = tensor.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"))
    config = json.loads((dense_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                                     "desc_act": act_order, "sym": False, "checkpoint_format": "gptq"}
    (out_dir / "config.json").write_text(json.dumps(config))
    for file in dense_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            (out_dir / file.name).write_bytes(file.read_bytes())
    model.load_state_dict(state, strict=False)
    return model


@pytest.mark.parametrize("act_order", [False, True])
def test_a_gptq_checkpoint_generates_what_its_dequantised_weights_do(tmp_path, act_order):
    reference = write_gptq(build_tiny_model(tmp_path / "dense", "llama"), tmp_path / "gptq", act_order)
    with torch.no_grad():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    expected = out[0, len(PROMPT):].tolist()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(str(tmp_path / "gptq"), dtype="float32", kv_cache_memory_gib=0.01, attention_backend="torch")
    assert llm.engine.core.runner.config.quantization == "gptq"
    assert llm.generate([PROMPT], params)[0].outputs[0].token_ids == expected
    # The default path (the CPU INT4 kernel where this CPU has it) runs the same weights.
    native = LLM(str(tmp_path / "gptq"), kv_cache_memory_gib=0.01)
    assert len(native.generate([PROMPT], params)[0].outputs[0].token_ids) == 24
    if cpu_native.available() and cpu_int4.available():  # act-order gathers its input: not in the stack
        assert (native.engine.core.runner.model.model.decoder_stack is None) == act_order


def test_merged_shards_must_share_their_act_order():
    from kvdeck.engine.runner.models.linear import Linear

    method = GPTQLinearMethod(GPTQConfig(group_size=GROUP, desc_act=True))
    layer = Linear(64, [32, 32], False, method, torch.float32)
    first = torch.randperm(64).to(torch.int32) // GROUP
    layer.load_weight("g_idx", first, 1)
    layer.load_weight("g_idx", first, 0)
    with pytest.raises(ValueError, match="share one g_idx"):
        layer.load_weight("g_idx", torch.arange(64, dtype=torch.int32) // GROUP, 0)


def test_variants_we_cannot_run_are_refused():
    with pytest.raises(ValueError, match="bits must be 4"):
        GPTQConfig.from_quant_config({"bits": 8})
    with pytest.raises(ValueError, match="-1, one group per row"):
        GPTQConfig.from_quant_config({"bits": 4, "group_size": -1})
    with pytest.raises(ValueError, match="checkpoint_format 'gptq_v2'"):
        GPTQConfig.from_quant_config({"bits": 4, "checkpoint_format": "gptq_v2"})
    assert GPTQConfig.from_quant_config({"bits": 4, "group_size": 64, "desc_act": True}).desc_act
