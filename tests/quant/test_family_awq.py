"""Gemma 2, Gemma 3 and Phi-3 load from AWQ checkpoints (AutoAWQ's GEMM layout): the engine
generates what transformers generates with the checkpoint's weights dequantised. Phi-3's
fused qkv_proj and gate_up_proj are packed whole, as AutoAWQ stores them."""

import json

import pytest
import torch
from safetensors.torch import save_file

from kvdeck import LLM, SamplingParams
from kvdeck.quant.packing import pack_awq_weight
from tests.model_factory import build_tiny_model
from tests.quant.awq_reference import reference_dequantize

GROUP = 32  # divides the tiny models' widths (64, 128)
PROMPT = [(7 * i) % 300 + 3 for i in range(30)]
MAX_NEW = 24


def _write_awq(dense_dir, out_dir):
    """Pack every decoder projection of the transformers model in `dense_dir`; returns the
    transformers model with those weights dequantised (the reference)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()
    out_dir.mkdir()
    tensors, state = {}, {}
    for name, tensor in model.state_dict().items():
        module = name.rpartition(".")[0]
        if ".layers." in name and name.endswith("proj.weight"):
            qweight, qzeros, scales = pack_awq_weight(tensor, GROUP)
            tensors |= {f"{module}.qweight": qweight, f"{module}.qzeros": qzeros,
                        f"{module}.scales": scales}
            state[name] = reference_dequantize(qweight, qzeros, scales, GROUP).t().float()
        elif name != "lm_head.weight" or not model.config.tie_word_embeddings:
            tensors[name] = tensor.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"))
    config = json.loads((dense_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                     "zero_point": True, "version": "gemm"}
    (out_dir / "config.json").write_text(json.dumps(config))
    for file in dense_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            (out_dir / file.name).write_bytes(file.read_bytes())
    model.load_state_dict(state, strict=False)
    return model


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "phi3"])
def test_awq_checkpoint_generates_what_its_dequantised_weights_do(tmp_path, family):
    overrides = {"sliding_window": 20} if family.startswith("gemma") else {}
    dense = build_tiny_model(tmp_path / "dense", family, **overrides)
    reference = _write_awq(dense, tmp_path / "awq")
    with torch.no_grad():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    expected = out[0, len(PROMPT):].tolist()
    llm = LLM(str(tmp_path / "awq"), dtype="float32", kv_cache_memory_gib=0.01)
    assert llm.engine.core.runner.config.quantization == "awq"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    assert llm.generate([PROMPT], params)[0].outputs[0].token_ids == expected
