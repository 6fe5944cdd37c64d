"""QLoRA-style serving: an adapter over an AWQ base (AutoAWQ's GEMM layout) generates what
the base's dequantised weights with the adapter merged generate, on the torch path and on the
Triton one (the repacked kernel, interpreted), where the adapter's slots undo the gate | up
layers' pairing for the fused activation."""

import json

import pytest
import torch

from kvdeck import LLM, SamplingParams
from tests.engine.lora.conftest import MAX_NEW, PROMPTS
from tests.quant.awq_checkpoint import write_awq

GROUP = 32  # divides the tiny models' widths (64, 128)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_adapter_over_an_awq_base_matches_the_dequantised_base_plus_adapter(lora_llama, tmp_path, backend,
                                                                            monkeypatch):
    from peft import PeftModel

    setup = lora_llama
    dequantised = write_awq(setup.model_dir, tmp_path / "awq", GROUP)
    merged = PeftModel.from_pretrained(dequantised, setup.adapters["sql"]).merge_and_unload().eval()
    with torch.no_grad():
        out = merged.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=MAX_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    expected = out[0, len(PROMPTS[1]):].tolist()
    if backend == "triton":  # the INT4 layers repacked for the marlin kernel, as on CUDA
        monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
        config = json.loads((tmp_path / "awq" / "config.json").read_text())
        config["quantization_config"]["w4a16_backend"] = "triton"
        (tmp_path / "awq" / "config.json").write_text(json.dumps(config))
    # The INT4 reference product (the CPU INT4 kernel's int8 activations round otherwise).
    with LLM(str(tmp_path / "awq"), dtype="float32", attention_backend=backend, enable_lora=True,
             num_gpu_blocks_override=32, max_model_len=128) as llm:
        assert llm.engine.core.runner.config.quantization == "awq"
        for layer in llm.engine.core.runner.model.model.layers:
            gate_up = layer.mlp.gate_up_proj
            assert gate_up.lora is not None and not gate_up.fuses_activation()
            assert (gate_up.repacked is not None) == (backend == "triton")
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        got = llm.generate([PROMPTS[1], PROMPTS[0]], params, lora_request=[setup.requests["sql"], None])
    assert list(got[0].outputs[0].token_ids) == expected
