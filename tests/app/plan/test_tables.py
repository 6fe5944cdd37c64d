"""The GPU and model tables, the pool they size, the cost models, and bad names."""

import pytest

from kvdeck.app.plan.cost_model import FittedCostModel, RooflineCostModel, StepSample, StepShape
from kvdeck.app.plan.gpus import GPUS, find_gpu
from kvdeck.app.plan.model_shapes import NAMED_SHAPES, find_model_shape
from kvdeck.app.plan.pool import GIB, pool_on_gpu


def test_named_shapes_have_their_published_sizes():
    # Parameter counts as the model cards say them (within 5%: norms and biases left out).
    for name, billions in [("Qwen3-8B", 8.2), ("Llama-3.1-8B", 8.03), ("Qwen3-0.6B", 0.6),
                           ("Mistral-7B", 7.25), ("Qwen3-14B", 14.8)]:
        assert find_model_shape(name).num_params / 1e9 == pytest.approx(billions, rel=0.05), name
    qwen = find_model_shape("Qwen/Qwen3-8B-AWQ")  # a hub id names the same shape
    assert qwen.kv_bytes_per_token("auto") == 2 * 36 * 8 * 128 * 2  # 144 KiB a token
    assert qwen.kv_bytes_per_token("fp8") * 2 == qwen.kv_bytes_per_token("auto")


def test_a_24_gb_card_with_an_8b_awq_model_has_a_sane_pool():
    shape = find_model_shape("Qwen3-8B")
    pool = pool_on_gpu(find_gpu("RTX 4090"), shape, "awq", "auto", 16, 0.9, 8192, 256)
    assert 5.0 * GIB < pool.weight_bytes < 6.5 * GIB  # INT4 linears, 16-bit embeddings and head
    kv_gib = pool.num_blocks * pool.block_bytes / GIB
    assert 12 < kv_gib < 16
    contexts = pool.num_blocks / shape.blocks_per_context(8192, 16)
    assert 10 < contexts < 15  # fewer than 16 users at a full 8k context
    fp8 = pool_on_gpu(find_gpu("RTX 4090"), shape, "awq", "fp8", 16, 0.9, 8192, 256)
    assert fp8.num_blocks == pytest.approx(2 * pool.num_blocks, abs=1)
    bf16 = pool_on_gpu(find_gpu("4090"), shape, "bf16", "auto", 16, 0.9, 8192, 256)
    assert bf16.num_blocks < pool.num_blocks / 2
    with pytest.raises(ValueError, match="does not fit on RTX 4090"):
        pool_on_gpu(find_gpu("RTX 4090"), find_model_shape("Qwen3-32B"), "bf16", "auto", 16, 0.9,
                    8192, 256)


def test_every_card_is_found_by_its_name():
    for gpu in GPUS:
        assert find_gpu(gpu.name) is gpu
        assert find_gpu(gpu.name.lower().replace(" ", "")) is gpu


def test_unknown_names_are_errors_that_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'RTX 4091'.*did you mean 'RTX 4090'") as err:
        find_gpu("RTX 4091")
    assert all(gpu.name in str(err.value) for gpu in GPUS)
    with pytest.raises(ValueError, match="unknown model 'Qwen3-9B'") as err:
        find_model_shape("Qwen3-9B")
    assert all(name in str(err.value) for name in NAMED_SHAPES)


def test_roofline_decode_is_bandwidth_bound_and_prefill_compute_bound():
    shape = find_model_shape("Llama-3.1-8B")
    cost = RooflineCostModel(find_gpu("RTX 4090"), shape, "bf16", "auto")
    decode = cost.step_seconds(StepShape(1, 1, 0, 1000, 1000))
    weights_s = shape.weight_bytes_per_step("bf16") / (1008e9 * 0.8)
    assert decode == pytest.approx(weights_s + 0.002, rel=0.02)  # 16 GB at 806 GB/s: ~20 ms
    prefill = cost.step_seconds(StepShape(1, 0, 4096, 4096, 4096 * 4097 // 2))
    assert prefill > 4096 * shape.flops_per_token() / (165.2e12 * 0.6)
    assert cost.step_seconds(StepShape(64, 64, 0, 64 * 2000, 64 * 2000)) > decode  # KV reads


def test_fit_recovers_a_linear_step_cost_and_refuses_too_few_steps():
    samples = []
    for i in range(40):
        shape = StepShape(1 + i % 7, i % 7, (i * 37) % 300, 100 + i * 13, 0)
        samples.append(StepSample(shape, 0.004 + 0.0005 * shape.num_seqs + 2e-5 * shape.prefill_tokens))
    model = FittedCostModel.fit(samples, "synthetic steps")
    assert model.fit_error < 1e-6
    probe = StepShape(3, 2, 100, 500, 0)
    assert model.step_seconds(probe) == pytest.approx(0.004 + 0.0015 + 0.002, rel=1e-6)
    with pytest.raises(ValueError, match="too few"):
        FittedCostModel.fit(samples[:3], "three steps")
