"""benchmarks/lora_tune.py: a GPU sweep's fastest runnable candidate becomes its architecture's
entry in the tuned table (others kept), which lora_plan then serves; a smoke or CPU sweep
tunes nothing. And the sweep's shapes are the model's LoRA linears."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import lora_tune  # noqa: E402


def _sweep(arch=90, smoke=False) -> dict:
    rows = [{"config": "split_k=0,block_n=32,fused=1,num_warps=2", "error": "OutOfResources: shared memory"},
            {"config": "split_k=256,block_n=128,fused=0,num_warps=4", "step_ms": 0.61},
            {"config": "split_k=128,block_n=256,fused=1,num_warps=4,overlap=0", "step_ms": 0.42},
            {"config": "split_k=256,block_n=64,fused=0,num_warps=4,overlap=1", "step_ms": 0.40},
            {"config": "split_k=0,block_n=64,fused=0,num_warps=4", "step_ms": 2.9}]
    return {"config": {"arch": arch, "smoke": smoke}, "rows": rows, "command": "python bench_lora_kernels.py",
            "environment": {"device": "NVIDIA H200"}}


def test_the_fastest_runnable_candidate_is_written_for_its_arch(tmp_path, monkeypatch):
    table = tmp_path / "lora_tuned.py"
    head = (REPO / "kernels" / "triton" / "lora_tuned.py").read_text()
    table.write_text(head.replace("TUNED: dict[int, dict] = {}",
                                  "TUNED: dict[int, dict] = {80: {'config': {}}}"))
    sweep = tmp_path / "lora_kernels_h200.json"
    sweep.write_text(json.dumps(_sweep()))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lora_tune.py"), str(sweep),
                           "--table", str(table)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    namespace: dict = {}
    exec(table.read_text(), namespace)
    assert namespace["TUNED"][80] == {"config": {}}  # another arch's entry kept
    entry = namespace["TUNED"][90]
    assert entry["config"] == {"split_k": 256, "block_n": 64, "fused": False, "num_warps": 4, "overlap": True,
                               "grouped": False}
    assert "H200" in entry["source"] and entry["step_ms"] == 0.4
    from kvdeck.kernels.triton import lora_plan

    monkeypatch.setattr(lora_plan, "_CHOSEN", {})
    monkeypatch.setattr(lora_plan, "TUNED", namespace["TUNED"])
    monkeypatch.delenv("KVDECK_LORA_KERNEL", raising=False)
    assert lora_plan.lora_kernel_config(90) == lora_plan.LoRAKernelConfig(256, 64, False, 4, overlap=True)


@pytest.mark.parametrize("sweep, says", [(_sweep(smoke=True), "smoke"), (_sweep(arch=None), "architecture"),
                                         ({**_sweep(), "rows": _sweep()["rows"][:1]}, "timed no candidate")])
def test_a_sweep_without_gpu_timings_tunes_nothing(sweep, says):
    with pytest.raises(ValueError, match=says):
        lora_tune.pick(sweep)


def test_the_sweep_shapes_are_qwen3_linears():
    import bench_lora_kernels

    assert bench_lora_kernels.linear_shapes(bench_lora_kernels.QWEN3_CONFIG) == [
        ("qkv", 1024, [2048, 1024, 1024]), ("o", 2048, [1024]), ("gate_up", 1024, [3072, 3072]),
        ("down", 3072, [1024])]


def test_the_decode_target_runs_under_the_committed_config_without_a_pick(tiny_llama_dir, tmp_path):
    # run_gpu.sh lora goes on after a failed sweep: bench_lora_gpu.py then serves the committed
    # config and says so in its JSON.
    out = tmp_path / "lora.json"
    command = [sys.executable, str(REPO / "benchmarks" / "bench_lora_gpu.py"), "--smoke", "--model",
               str(tiny_llama_dir), "--config-from", str(tmp_path / "missing.json"), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["config"]["config_from"] is None and "committed" in result["config"]["config_note"]
    assert (result["config"]["lora_kernel_config"]
            == "split_k=256,block_n=128,fused=0,num_warps=4,overlap=0,grouped=0")


def test_the_sweep_tries_every_form_and_stops_checking_past_its_budget(tmp_path):
    import bench_lora_kernels

    full = bench_lora_kernels.candidates(smoke=False)
    # Per row: 4 splits x 3 blocks x 2 warp counts x 3 forms; then the grouped kernels'.
    assert len(full) == len(set(full)) == 72 + len(bench_lora_kernels.GROUPED)
    assert full[:2] == [bench_lora_kernels.DEFAULT_CONFIG, bench_lora_kernels.FIRST_LAUNCH]
    # Next, alternating: the default's other two forms per row, the grouped kernels' three forms.
    assert [c.grouped for c in full[2:8]] == [True, False] * 3
    assert {(c.fused, c.overlap) for c in full[2:6] if not c.grouped} == {(False, True), (True, False)}
    grouped_forms = {(c.fused, c.overlap) for c in full[2:7] if c.grouped}
    assert grouped_forms == {(True, False), (False, False), (False, True)}
    # A budget already spent: the two every figure compares with are checked and timed, the
    # rest recorded as skipped, none of them lost.
    out = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_lora_kernels.py"), "--smoke",
                           "--budget-s", "0.001", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    timed = [row["config"] for row in rows if "step_ms" in row]
    skipped = [row["config"] for row in rows if row.get("skipped")]
    assert timed == [c.label() for c in bench_lora_kernels.candidates(smoke=True)[:2]]
    assert len(skipped) == len(bench_lora_kernels.candidates(smoke=True)) - 2
