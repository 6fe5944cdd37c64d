"""INT4 (AWQ) models on the CPU: the layers repacked into the INT4 kernel's tiles, the output
head in int8, a decode step in the native decoder stack. The stack gives the Python forward's
greedy tokens (bf16: the same bits; fp32: the same kernels), the kernels give what their
torch references give, and without the kernels the model runs the reference product."""

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.models import native_decode
from kvdeck.engine.runner.models.linear import Int8OutputHead
from kvdeck.kernels.cpu import build
from kvdeck.kernels.cpu import int4 as cpu_int4
from kvdeck.kernels.cpu import int8 as cpu_int8
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.decode_stack import DecoderStack
from kvdeck.kernels.cpu.int4 import Int4Weight
from kvdeck.kernels.reference.w4a16_gemm import quantize_activations_q8
from tests.kernels.test_cpu_int4 import needs_int4
from tests.kernels.test_cpu_native import needs_kernel
from tests.model_factory import build_tiny_model
from tests.quant.awq_checkpoint import write_awq

LONG = [(7 * i) % 300 + 3 for i in range(45)]
PROMPTS = [[7, 8, 9, 10, 11, 12], LONG, LONG[:40]]
OPTIONS = dict(kv_cache_memory_gib=0.01, max_num_seqs=3, max_num_batched_tokens=32)


def _awq_model(tmp_path, family: str):
    out = tmp_path / f"{family}-awq"
    write_awq(build_tiny_model(tmp_path / family, family), out)
    return str(out)


def _generate(llm: LLM, max_tokens: int = 32) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


def _runner(llm: LLM):
    return llm.engine.core.runner


@needs_kernel
@needs_int4
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])  # qwen2: a qkv bias; qwen3: q/k norms
def test_the_stack_gives_the_python_forwards_tokens(tmp_path, monkeypatch, family, dtype):
    model = _awq_model(tmp_path, family)
    rows = []
    run = DecoderStack.run
    monkeypatch.setattr(DecoderStack, "run", lambda self, *a: rows.append(a[0].shape[0]) or run(self, *a))
    native = LLM(model, dtype=dtype, **OPTIONS)
    stack = _runner(native).model.model.decoder_stack
    assert isinstance(stack.layers[0].qkv, Int4Weight) and isinstance(stack.layers[0].down, Int4Weight)
    bf16_rows = cpu_native.BF16_STACK_MAX_ROWS
    assert stack.max_rows == (native_decode.INT4_MAX_ROWS if dtype == "float32" else bf16_rows)
    assert isinstance(_runner(native).model.lm_head, Int8OutputHead)
    tokens = _generate(native)
    assert 3 in rows  # the three decoding requests in one native step
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    python = LLM(model, dtype=dtype, **OPTIONS)
    assert _runner(python).model.model.decoder_stack is None
    assert tokens == _generate(python)


def _q8(x: torch.Tensor) -> torch.Tensor:
    flat = x.float().reshape(-1, x.shape[-1])
    x8, scales = quantize_activations_q8(flat)
    return (x8.view(flat.shape[0], -1, 32) * scales.unsqueeze(-1)).view(flat.shape)


@needs_int4
def test_the_kernels_give_their_references_tokens(tmp_path, monkeypatch):
    """fp32: the engine with the CPU kernels against the same engine whose INT4 layers and
    int8 head compute their torch references (int8 activations, the tiles dequantised)."""
    model = _awq_model(tmp_path, "llama")
    native_tokens = _generate(LLM(model, dtype="float32", **OPTIONS))

    def int4_reference(x, weight, bias=None):
        out = _q8(x) @ cpu_int4.dequantize(weight).t()
        out = out if bias is None else out + bias
        return out.to(x.dtype).view(*x.shape[:-1], weight.n)

    def int8_reference(x, weight):
        return (_q8(x) @ cpu_int8.dequantize(weight).t()).to(x.dtype).view(*x.shape[:-1], weight.n)

    monkeypatch.setattr(cpu_int4, "gemm", int4_reference)
    monkeypatch.setattr(cpu_int8, "gemm", int8_reference)
    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
    assert native_tokens == _generate(LLM(model, dtype="float32", **OPTIONS))


def test_without_the_kernels_the_reference_product_runs(tmp_path, monkeypatch):
    """KVDECK_CPU_NATIVE=0 (or a CPU without AVX2): no tiles, no stack, the dense head, fp32,
    and the tokens of the reference backend."""
    model = _awq_model(tmp_path, "llama")
    reference = _generate(LLM(model, attention_backend="torch", **OPTIONS))
    monkeypatch.setenv("KVDECK_CPU_NATIVE", "0")
    build.library.cache_clear()
    try:
        llm = LLM(model, **OPTIONS)
        runner = _runner(llm)
        assert runner.dtype == torch.float32 and runner.model.model.decoder_stack is None
        assert not isinstance(runner.model.lm_head, Int8OutputHead)
        assert all(getattr(m, "int4", None) is None for m in runner.model.modules())
        assert _generate(llm) == reference
    finally:
        monkeypatch.delenv("KVDECK_CPU_NATIVE")
        build.library.cache_clear()


@needs_kernel
@needs_int4
def test_an_int4_checkpoint_runs_bf16_on_a_bf16_cpu(tmp_path):
    """AutoAWQ checkpoints are fp16; where the CPU has bf16 and the INT4 kernels, auto is bf16."""
    assert _runner(LLM(_awq_model(tmp_path, "llama"), **OPTIONS)).dtype == torch.bfloat16
