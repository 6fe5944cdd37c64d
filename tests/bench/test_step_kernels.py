"""benchmarks/step_kernels.py: a profiler trace's kernels, copies and fills summed by kind and
name per step, the device's busy time with overlaps counted once, and the engine helper that
brings a batch to its decode steps."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_kernels  # noqa: E402
from step_kernels import DeviceEvent, breakdown, busy_us, device_events, kernel_kind  # noqa: E402


def _event(cat: str, name: str, ts: float, dur: float, ph: str = "X") -> dict:
    return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur}


@pytest.mark.parametrize(("name", "kind"), [
    ("_w4a16_marlin_kernel", "w4a16"),
    ("_w4a16_gemv_kernel", "w4a16"),
    ("_marlin_dequantize_kernel", "w4a16"),
    ("_int8_head_kernel", "int8_head"),
    ("_lora_shrink_kernel", "lora"),
    ("_lora_expand_kernel", "lora"),
    ("_paged_attention_kernel", "attention"),
    ("_merge_segments_kernel", "attention"),
    ("_write_kv_cache_kernel", "kv_write"),
    ("_qk_norm_rope_kv_kernel", "norm_rope"),
    ("_rms_norm_kernel", "norm_rope"),
    ("_act_and_mul_kernel", "activation"),
    ("nvjet_tst_128x64_64x4_1x1_v_bz_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ArgMaxOps<float>>>", "sampling"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", "elementwise"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long>", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::MulFunctor<float>>", "elementwise"),
    ("some_multiplication_kernel", "other"),
])
def test_kernels_are_named_by_kind(name, kind):
    assert kernel_kind(name) == kind


def test_the_trace_gives_kernels_copies_and_fills_only():
    trace = {"traceEvents": [
        _event("cpu_op", "aten::mm", 0, 50),
        _event("cuda_runtime", "cudaGraphLaunch", 0, 5),
        _event("kernel", "_rms_norm_kernel", 10, 2.5),
        _event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 1, 1),
        _event("gpu_memset", "Memset (Device)", 2, 0.5),
        _event("kernel", "flow start", 3, 0, ph="s"),  # not a complete event
        {"ph": "M", "name": "process_name", "args": {}},
    ]}
    events = device_events(trace)
    assert [(e.name, e.kind, e.start_us, e.duration_us) for e in events] == [
        ("_rms_norm_kernel", "norm_rope", 10.0, 2.5),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", 1.0, 1.0),
        ("Memset (Device)", "memset", 2.0, 0.5),
    ]


def test_busy_time_counts_overlaps_once():
    events = [DeviceEvent("a", "gemm", 5, 10), DeviceEvent("b", "lora", 0, 10),  # 0-15
              DeviceEvent("c", "lora", 7, 2),  # inside
              DeviceEvent("d", "norm_rope", 20, 5)]  # 20-25
    assert busy_us(events) == 20
    assert busy_us([]) == 0


def test_breakdown_per_step():
    events = [DeviceEvent("_w4a16_marlin_kernel", "w4a16", 0, 30), DeviceEvent("nvjet", "gemm", 40, 20),
              DeviceEvent("_w4a16_marlin_kernel", "w4a16", 100, 30), DeviceEvent("nvjet", "gemm", 140, 20),
              DeviceEvent("_lora_shrink_kernel", "lora", 140, 10)]  # beside the GEMM: busy once
    figures = breakdown(events, steps=2, wall_s=400e-6, top=2)
    assert figures["steps"] == 2 and figures["kernels_per_step"] == 2.5
    assert figures["wall_ms_per_step"] == pytest.approx(0.2)
    assert figures["device_ms_per_step"] == pytest.approx(0.055)
    assert figures["busy_ms_per_step"] == pytest.approx(0.05)
    assert figures["idle_ms_per_step"] == pytest.approx(0.15)
    assert figures["busy_fraction"] == pytest.approx(0.25)
    assert list(figures["by_kind"]) == ["w4a16", "gemm", "lora"]  # most time first
    assert figures["by_kind"]["w4a16"] == pytest.approx({"ms_per_step": 0.03, "launches_per_step": 1.0})
    assert figures["by_kind"]["lora"] == pytest.approx({"ms_per_step": 0.005, "launches_per_step": 0.5})
    assert [(row["name"], row["mean_us"]) for row in figures["top"]] == [("_w4a16_marlin_kernel", 30),
                                                                         ("nvjet", 20)]
    line = step_kernels.summary_line(figures)
    assert "0.200 ms a step, device busy 0.050" in line and "w4a16 0.030 (1)" in line


def test_nothing_recorded_is_said_and_no_steps_refused():
    figures = breakdown([], steps=4, wall_s=0.004)
    assert figures == {"steps": 4, "wall_ms_per_step": pytest.approx(1.0), "kernels_per_step": 0.0,
                       "note": "no device kernels recorded (no CUDA activity in the profile)"}
    assert "no device kernels recorded" in step_kernels.summary_line(figures)
    with pytest.raises(ValueError, match="steps must be at least 1"):
        breakdown([], steps=0, wall_s=1.0)


def test_profile_steps_runs_the_step_and_a_failure_is_recorded():
    calls = []
    figures = step_kernels.profile_steps(lambda: calls.append(1), 3)
    assert len(calls) == 3 and figures["steps"] == 3 and figures["wall_ms_per_step"] >= 0

    def broken():
        raise RuntimeError("CUPTI said no")

    failed = step_kernels.profile_steps_or_error(broken, 2)
    assert failed == {"error": "RuntimeError: CUPTI said no"}
    assert step_kernels.summary_line(failed) == "not profiled: RuntimeError: CUPTI said no"


def test_decoding_brings_every_request_to_decode_and_aborts_after(tiny_llama_dir):
    from kvdeck import LLM

    with LLM(str(tiny_llama_dir), device="cpu", dtype="float32", kv_cache_memory_gib=0.01,
             enforce_eager=True) as llm:
        core = llm.engine.core
        with step_kernels.decoding(llm, [[5, 6, 7], [8, 9, 10, 11]], max_tokens=8) as ids:
            assert len(ids) == 2 and all(r.output_token_ids for r in core.requests.values())
            figures = step_kernels.profile_steps(llm.engine.step, 2)
            assert figures["steps"] == 2
            assert all(len(r.output_token_ids) >= 3 for r in core.requests.values())
        assert not core.requests  # aborted: no request or KV block left behind
        occupancy = llm.engine.occupancy()
        assert occupancy.usage == 0 and occupancy.num_running == 0
