"""Checkpoints quantised by the `autoawq` package load in kvdeck and compute the same
function as their weights dequantised here; AutoAWQ reads what kvdeck writes.

CI installs autoawq with: pip install autoawq==0.2.9 --no-deps && pip install accelerate
datasets zstandard (keeping the installed torch).
"""

import json
import shutil
import warnings

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.quant.hf_int4 import load_awq_into_transformers, read_safetensors
from kvdeck.quant.packing import fake_quantize, pack_awq_weight, quantize_groups
from tests.quant.awq_reference import reference_dequantize

PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def autoawq_dir(group128_llama_dir, tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("awq", reason="autoawq is not installed")
        from awq import AutoAWQForCausalLM

        model = AutoAWQForCausalLM.from_pretrained(str(group128_llama_dir), dtype=torch.float32)
        gen = torch.Generator().manual_seed(1)
        calib = [torch.randint(0, 300, (64,), generator=gen).tolist() for _ in range(4)]
        model.quantize(
            None,
            quant_config={"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"},
            calib_data=calib, max_calib_samples=4, max_calib_seq_len=64,
            # AutoAWQ's clip search is its slowest step on CPU and does not change the format.
            apply_clip=False,
        )
    out = tmp_path_factory.mktemp("autoawq") / "llama-awq"
    model.save_quantized(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(group128_llama_dir / name, out / name)
    return out


def _dense_reference(awq_dir):
    """The transformers model with every AWQ linear dequantised by the test's own reader."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(awq_dir)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = read_safetensors(awq_dir)
    state = {}
    for name, tensor in tensors.items():
        if name.endswith(".qweight"):
            prefix = name[: -len(".qweight")]
            dense = reference_dequantize(tensor, tensors[f"{prefix}.qzeros"],
                                         tensors[f"{prefix}.scales"], 128)
            state[f"{prefix}.weight"] = dense.t().float()
        elif not name.endswith((".qzeros", ".scales")):
            state[name] = tensor.float()
    model.load_state_dict(state, strict=True)
    return model.eval()


def test_autoawq_checkpoint_logits_match_dequantised_weights(autoawq_dir):
    config = json.loads((autoawq_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "awq"
    reference = _dense_reference(autoawq_dir)
    int4 = load_awq_into_transformers(autoawq_dir, backend="torch")
    ids = torch.tensor([PROMPT + list(range(20, 40))])
    with torch.no_grad():
        expected = reference(ids).logits
        got = int4(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_engine_generates_what_the_dequantised_model_generates(autoawq_dir):
    reference = _dense_reference(autoawq_dir)
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                                  eos_token_id=None)[0, len(PROMPT):].tolist()
    llm = LLM(model=str(autoawq_dir), device="cpu", dtype="float32", max_model_len=128,
              quantization="awq")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert llm.generate([PROMPT], params)[0].outputs[0].token_ids == expected


def test_engine_triton_int4_path_matches_reference_path(autoawq_dir, tmp_path):
    """Greedy generation with the Triton W4A16 kernel (interpreter on CPU) equals the
    dequantise-then-matmul path, through the engine's merged qkv/gate_up layers."""
    triton_dir = tmp_path / "awq-triton"
    shutil.copytree(autoawq_dir, triton_dir)
    config = json.loads((triton_dir / "config.json").read_text())
    config["quantization_config"]["w4a16_backend"] = "triton"
    (triton_dir / "config.json").write_text(json.dumps(config))
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    outputs = []
    for model_dir in (autoawq_dir, triton_dir):
        llm = LLM(model=str(model_dir), device="cpu", dtype="float32", max_model_len=64,
                  quantization="awq")
        outputs.append(llm.generate([PROMPT], params)[0].outputs[0].token_ids)
    assert outputs[0] == outputs[1]


def test_our_packing_is_bit_identical_to_autoawq():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("awq", reason="autoawq is not installed")
        from awq.modules.linear.gemm import WQLinear_GEMM
        from awq.utils.packing_utils import dequantize_gemm
    gen = torch.Generator().manual_seed(4)
    linear = torch.nn.Linear(256, 64, bias=False)
    linear.weight.data = torch.randn(64, 256, generator=gen) * 0.05
    qweight, qzeros, scales = pack_awq_weight(linear.weight.data, 128)
    # AutoAWQ packs an already fake-quantised weight with its scales and zeros.
    _, group_scales, zeros = quantize_groups(linear.weight.data, 128)
    linear.weight.data = fake_quantize(linear.weight.data, 128)
    theirs = WQLinear_GEMM.from_linear(linear, 4, 128, scales=group_scales.t().contiguous(),
                                       zeros=zeros.t().contiguous())
    assert torch.equal(theirs.qweight, qweight)
    assert torch.equal(theirs.qzeros, qzeros)
    torch.testing.assert_close(theirs.scales, scales)
    # ...and AutoAWQ's own reader dequantises kvdeck's tensors to kvdeck's weight.
    dense = dequantize_gemm(qweight, qzeros, scales.float(), 4, 128)
    torch.testing.assert_close(dense.double(), reference_dequantize(qweight, qzeros, scales, 128))
