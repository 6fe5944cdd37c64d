"""The Models screen's memory figures on the CPU are what the engine will hold: its dtype on
this CPU, INT4 layers at 4 bits (the INT4 kernels' tiles), an INT4 model's output head int8,
the copies the bf16 path keeps (app/store/cpu_plan.py, without torch)."""

import json
import shutil
from pathlib import Path

import pytest

from kvdeck.app.store.cpu_plan import (
    CpuFeatures,
    cpu_features,
    engine_cpu_dtype,
    features_from_flags,
    int4_tile_bytes,
)
from kvdeck.app.store.recommended import RECOMMENDED, local_memory_estimate, memory_estimate

EVERYTHING = CpuFeatures(bf16=True, bf16_kernels=True, int4_kernels=True)
NOTHING = CpuFeatures(bf16=False, bf16_kernels=False, int4_kernels=False)


def held_bytes(model) -> int:
    """Every tensor the loaded model holds (parameters, buffers, the row-major copies, INT4
    and int8 tiles), each storage once, less the rotary table (a few MB the estimate leaves out)."""
    import torch

    from kvdeck.kernels.cpu.int4 import Int4Weight
    from kvdeck.kernels.cpu.int8 import Int8Weight

    seen, total = set(), 0
    for module in model.modules():
        held = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        held += [getattr(module, name, None) for name in ("dense_weight", "int4", "tiles")]
        for tensor in held:
            if isinstance(tensor, Int4Weight | Int8Weight):
                tensor = tensor.tiles
            if not isinstance(tensor, torch.Tensor):
                continue
            key = id(tensor) if tensor.is_mkldnn else tensor.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
    rotary = sum(b.numel() * b.element_size() for name, b in model.named_buffers() if "cos_sin" in name)
    return total - rotary


@pytest.fixture(scope="module")
def cpu_models(hub_model_dir, tmp_path_factory) -> dict[str, Path]:
    """The tiny Llama as fp16 (the hub's), as bf16, and INT4 (RTN, group 64) made from it."""
    import torch
    from safetensors.torch import load_file, save_file

    from kvdeck.app.cli import main

    root = tmp_path_factory.mktemp("cpu-plan")
    bf16 = root / "bf16"
    shutil.copytree(hub_model_dir, bf16)
    for path in bf16.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, path,
                  metadata={"format": "pt"})
    config = json.loads((bf16 / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (bf16 / "config.json").write_text(json.dumps(config))
    int4 = root / "int4"
    assert main(["quantize", str(hub_model_dir), "--method", "rtn", "--group-size", "64", "--out",
                 str(int4), "--device", "cpu"]) == 0
    return {"fp16": hub_model_dir, "bf16": bf16, "int4": int4}


@pytest.mark.parametrize("kind", ["fp16", "bf16", "int4"])
def test_the_cpu_estimate_is_what_the_engine_holds(cpu_models, kind):
    from kvdeck import LLM

    model_dir = cpu_models[kind]
    config = json.loads((model_dir / "config.json").read_text())
    estimate = local_memory_estimate(config, 0, 256, "cpu", model_dir=model_dir)
    llm = LLM(str(model_dir), device="cpu", kv_cache_memory_gib=0.01, max_model_len=64)
    try:
        assert estimate.dtype == llm.engine.info.dtype  # resolve_dtype's choice, from the flags
        assert estimate.weight_bytes == held_bytes(llm.engine.core.runner.model)
        element = 2 if estimate.dtype == "bfloat16" else 4
        assert estimate.kv_cache_bytes == llm.engine.info.kv_bytes_per_token * 256 == (
            2 * 2 * 2 * 32 * element * 256)
    finally:
        llm.shutdown()


def test_int4_counts_at_4_bits_where_the_cpu_has_the_kernels(cpu_models):
    model_dir = cpu_models["int4"]
    config = json.loads((model_dir / "config.json").read_text())
    with_kernels = local_memory_estimate(config, 0, 256, "cpu", model_dir=model_dir, cpu=EVERYTHING)
    without = local_memory_estimate(config, 0, 256, "cpu", model_dir=model_dir, cpu=NOTHING)
    assert (with_kernels.dtype, without.dtype) == ("bfloat16", "float32")
    # tiles: 4 bits a weight plus 4 bytes per group of 64 and column; the head int8 (1 + 1/16)
    hidden, inter, vocab = 128, 256, config["vocab_size"]
    tiles = 2 * (int4_tile_bytes(128 + 64 + 64, hidden, 64) + int4_tile_bytes(hidden, hidden, 64)
                 + int4_tile_bytes(2 * inter, hidden, 64) + int4_tile_bytes(hidden, inter, 64))
    dense = (2 * vocab * hidden + 5 * hidden) * 2  # embedding, lm_head (untied), norms in bf16
    head = -(-vocab // 16) * 16 * hidden * 17 // 16
    assert with_kernels.weight_bytes == tiles + dense + head
    assert without.weight_bytes > with_kernels.weight_bytes  # AutoAWQ's tensors, fp32 rest
    # The recommended AWQ models too: a fifth of float32 (7B: 6.2 GB, the untied 152k x 3584
    # embedding and head in bf16 and int8 a third of it) on a CPU with the kernels.
    awq = next(r for r in RECOMMENDED if r.repo_id == "Qwen/Qwen2.5-7B-Instruct-AWQ")
    dense_7b = next(r for r in RECOMMENDED if r.repo_id == "Qwen/Qwen2.5-7B-Instruct")
    assert memory_estimate(awq, 4096, "cpu", EVERYTHING).weight_bytes < 0.21 * memory_estimate(
        dense_7b, 4096, "cpu", NOTHING).weight_bytes


def test_the_dtype_follows_resolve_dtypes_rule():
    awq = {"torch_dtype": "float16", "quantization_config": {"quant_method": "awq", "bits": 4}}
    assert engine_cpu_dtype({"torch_dtype": "bfloat16"}, EVERYTHING) == "bfloat16"
    assert engine_cpu_dtype({"torch_dtype": "float16"}, EVERYTHING) == "float32"
    assert engine_cpu_dtype(awq, EVERYTHING) == "bfloat16"
    assert engine_cpu_dtype(awq, CpuFeatures(True, True, False)) == "float32"
    assert engine_cpu_dtype({"torch_dtype": "bfloat16"}, NOTHING) == "float32"
    # torch's oneDNN bf16 check is AVX-512 BW/VL/DQ; kvdeck's bf16 kernels need AVX512-BF16.
    skylake = features_from_flags({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"},
                                  "x86_64", native=True, isa="native")
    assert (skylake.bf16, skylake.bf16_kernels, skylake.int4_kernels) == (True, False, True)
    plain = features_from_flags({"avx2", "fma", "f16c"}, "x86_64", native=False, isa="native")
    assert (plain.bf16, plain.bf16_kernels, plain.int4_kernels) == (False, False, False)
    assert isinstance(cpu_features(), CpuFeatures)
