"""An adapter over a GPTQ base (v1 checkpoint, with and without act-order) generates what the
base's dequantised weights with the adapter merged generate, and the base beside it what the
dequantised base generates."""

import pytest
import torch

from kvdeck import LLM, SamplingParams
from tests.engine.lora.conftest import MAX_NEW, PROMPTS
from tests.quant.test_gptq import write_gptq


@pytest.mark.parametrize("act_order", [False, True])
def test_adapter_over_a_gptq_base_matches_the_dequantised_base_plus_adapter(lora_llama, tmp_path, act_order):
    from peft import PeftModel

    setup = lora_llama
    dequantised = write_gptq(setup.model_dir, tmp_path / "gptq", act_order)
    with torch.no_grad():  # before peft merges the adapter into these weights
        base = dequantised.generate(torch.tensor([PROMPTS[2]]), max_new_tokens=MAX_NEW, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(PROMPTS[2]):].tolist()
    merged = PeftModel.from_pretrained(dequantised, setup.adapters["code"]).merge_and_unload().eval()
    with torch.no_grad():
        out = merged.generate(torch.tensor([PROMPTS[2]]), max_new_tokens=MAX_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    expected = out[0, len(PROMPTS[2]):].tolist()
    assert expected != base  # the adapter changes the output
    # attention_backend torch: the reference INT4 product (the CPU INT4 kernel's int8
    # activations round otherwise).
    with LLM(str(tmp_path / "gptq"), dtype="float32", attention_backend="torch", enable_lora=True,
             num_gpu_blocks_override=32, max_model_len=128) as llm:
        assert llm.engine.core.runner.config.quantization == "gptq"
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        got = llm.generate([PROMPTS[2], PROMPTS[2]], params, lora_request=[setup.requests["code"], None])
    assert list(got[0].outputs[0].token_ids) == expected
    assert list(got[1].outputs[0].token_ids) == base
