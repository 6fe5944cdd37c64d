"""Gemma 2, Gemma 3 and Phi-3 load from AWQ checkpoints (AutoAWQ's GEMM layout): the engine
generates what transformers generates with the checkpoint's weights dequantised. Phi-3's
fused qkv_proj and gate_up_proj are packed whole, as AutoAWQ stores them."""

import pytest
import torch

from kvdeck import LLM, SamplingParams
from tests.model_factory import build_tiny_model
from tests.quant.awq_checkpoint import write_awq

GROUP = 32  # divides the tiny models' widths (64, 128)
PROMPT = [(7 * i) % 300 + 3 for i in range(30)]
MAX_NEW = 24


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "phi3"])
def test_awq_checkpoint_generates_what_its_dequantised_weights_do(tmp_path, family):
    overrides = {"sliding_window": 20} if family.startswith("gemma") else {}
    dense = build_tiny_model(tmp_path / "dense", family, **overrides)
    reference = write_awq(dense, tmp_path / "awq", GROUP)
    with torch.no_grad():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    expected = out[0, len(PROMPT):].tolist()
    # the reference product: the layout is what is tested (the CPU INT4 kernel, whose int8
    # activations round otherwise, is held to its reference in tests/kernels and tests/engine)
    llm = LLM(str(tmp_path / "awq"), dtype="float32", kv_cache_memory_gib=0.01, attention_backend="torch")
    assert llm.engine.core.runner.config.quantization == "awq"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    assert llm.generate([PROMPT], params)[0].outputs[0].token_ids == expected
