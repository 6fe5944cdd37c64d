"""An INT4 model's output head in int8 on the GPU's kernel path (quant/int8_head.py): AWQ with
the Triton INT4 kernels (`w4a16_backend: triton`, interpreted here) serves its head from a
Q8_0 copy through the Triton int8 head; KVDECK_INT8_HEAD=0 keeps it dense everywhere; a bad
value is an error naming the variable; the roofline's bytes count the int8 head."""

import json

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.models.linear import Int8OutputHead
from kvdeck.engine.runner.weight_bytes import weight_bytes_read_per_step
from kvdeck.kernels.reference.int8_gemm import dequantize_int8_blocks, int8_head_torch, quantize_int8_blocks
from kvdeck.quant.int8_head import W8A16OutputHead, int8_head_setting
from tests.model_factory import build_tiny_model
from tests.quant.awq_checkpoint import write_awq

OPTIONS = dict(device="cpu", dtype="float32", kv_cache_memory_gib=0.01, max_num_seqs=2, enforce_eager=True)


@pytest.fixture(scope="module")
def awq_triton_dir(tmp_path_factory):
    """A tiny AWQ Llama with a tied head, whose INT4 layers run the Triton kernels."""
    root = tmp_path_factory.mktemp("int8-head")
    out = root / "awq"
    write_awq(build_tiny_model(root / "llama", "llama", tie_word_embeddings=True), out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["w4a16_backend"] = "triton"
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("", True)])
def test_the_setting_is_on_unless_turned_off(value, on):
    assert int8_head_setting({} if value is None else {"KVDECK_INT8_HEAD": value}) is on


def test_a_bad_setting_names_the_variable():
    with pytest.raises(ValueError, match="KVDECK_INT8_HEAD must be 0 or 1, got 'yes'"):
        int8_head_setting({"KVDECK_INT8_HEAD": "yes"})


def test_the_module_quantises_in_chunks_and_multiplies_by_its_kernel(monkeypatch):
    import kvdeck.quant.int8_head as int8_head_module

    monkeypatch.setattr(int8_head_module, "_QUANTISE_ROWS", 48)  # several chunks
    weight = torch.randn(130, 64)
    head = W8A16OutputHead(weight, backend="triton")
    q, scales = quantize_int8_blocks(weight)
    assert torch.equal(head.qweight, q) and torch.equal(head.scales, scales)
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(head(hidden), int8_head_torch(hidden, q, scales))
    dense = hidden @ weight.t()
    assert (head(hidden) - dense).norm() < 0.01 * dense.norm()  # Q8_0: under 1% off the dense head
    assert W8A16OutputHead.takes(weight, None)
    assert not W8A16OutputHead.takes(weight, torch.zeros(130))  # a bias
    assert not W8A16OutputHead.takes(weight[:, :40], None)  # not whole blocks of 32


def _generate(llm: LLM) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    return llm.generate([[5, 6, 7, 8, 9]], params)[0].outputs[0].token_ids


def test_an_awq_model_on_the_kernel_path_serves_its_head_in_int8(awq_triton_dir, monkeypatch):
    monkeypatch.setenv("KVDECK_W4A16_KERNEL", "marlin")
    with LLM(str(awq_triton_dir), **OPTIONS) as llm:
        model = llm.engine.core.runner.model
        head = model.lm_head
        assert isinstance(head, W8A16OutputHead) and head.backend == "triton"
        embedding = model.model.embed_tokens.weight
        # The tied embedding stays dense for its lookups; the head is its Q8_0 copy.
        q, scales = quantize_int8_blocks(embedding.data)
        assert torch.equal(head.qweight, q) and torch.equal(head.scales, scales)
        hidden = torch.randn(2, embedding.shape[1])
        torch.testing.assert_close(head(hidden), hidden @ dequantize_int8_blocks(q, scales).t())
        int8_bytes = weight_bytes_read_per_step(model)
        tokens = _generate(llm)
    monkeypatch.setenv("KVDECK_INT8_HEAD", "0")
    with LLM(str(awq_triton_dir), **OPTIONS) as dense:
        model = dense.engine.core.runner.model
        assert not isinstance(model.lm_head, W8A16OutputHead)
        matrix = model.lm_head.weight
        assert matrix is model.model.embed_tokens.weight  # tied: one fp32 matrix
        # The step reads the int8 copy (1 byte and a 2-byte scale per 32) in place of the dense head.
        saved = weight_bytes_read_per_step(model) - int8_bytes
        assert saved == matrix.numel() * (4 - 1) - matrix.numel() // 32 * 2
        assert len(_generate(dense)) == len(tokens) == 8


def test_off_keeps_the_cpu_kernels_head_dense_too(tmp_path, monkeypatch):
    out = tmp_path / "awq"
    write_awq(build_tiny_model(tmp_path / "llama", "llama"), out)
    monkeypatch.setenv("KVDECK_INT8_HEAD", "0")
    with LLM(str(out), device="cpu", kv_cache_memory_gib=0.01, max_num_seqs=2) as llm:
        head = llm.engine.core.runner.model.lm_head
        assert not isinstance(head, (Int8OutputHead, W8A16OutputHead))


def test_a_bad_value_stops_the_engine_before_it_serves(awq_triton_dir, monkeypatch):
    monkeypatch.setenv("KVDECK_INT8_HEAD", "2")
    with pytest.raises(ValueError, match="KVDECK_INT8_HEAD must be 0 or 1, got '2'"):
        LLM(str(awq_triton_dir), **OPTIONS)
