"""`benchmarks/run_gpu.sh all` on the CPU: every stage's commands run for real, on a tiny
model, with only what the GPU image has, the kernels under the Triton interpreter and a fake
clock (each stage billed its whole cap), so that a GPU lease cannot die on a typo. And the
driver's caps: a stage past its cap is killed with its children, the budget is never
overrun, the summary is written as it goes."""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_battery  # noqa: E402

# What each stage leaves in OUT_DIR (named after the device: "cpu" here).
STAGE_JSON = {
    "check": ["check_kernels_cpu.json", "cuda_graphs_cpu.json"],
    "w4a16": ["w4a16_cpu.json"],
    "lora": ["lora_gpu_cpu.json", "lora_kernels_cpu.json"],
    "throughput": ["throughput_qwen3-0.6b_cpu.json", "throughput_qwen3-0.6b_awq_marlin_cpu.json",
                   "throughput_qwen3-0.6b_sync_cpu.json", "throughput_qwen3-0.6b_eager_cpu.json"],
}


def test_the_caps_fit_the_lease():
    assert sum(cap for _, cap in gpu_battery.STAGES) <= gpu_battery.BUDGET_S <= 480
    assert [stage for stage, _ in gpu_battery.STAGES] == list(STAGE_JSON)


@pytest.mark.slow(seconds=120)
@pytest.mark.timeout(600)
def test_every_stage_runs_on_a_tiny_model(tiny_llama_dir, tmp_path):
    # As the device tool runs it (OUT_DIR=$OUT): everything in one archive, the one file there.
    device_out = tmp_path / "device_out"
    python = f"{sys.executable} {REPO / 'tests' / 'bench' / 'python_on_gpu_image.py'}"
    env = {**os.environ, "PYTHON": python, "OUT_DIR": str(device_out), "OUT": str(device_out),
           "KVDECK_BATTERY_SMOKE": str(tiny_llama_dir), "KVDECK_BATTERY_CAP_SCALE": "4"}
    env.pop("TRITON_INTERPRET", None)  # the script sets it for the smoke run itself
    env.pop("BATTERY_ARCHIVE", None)
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "run_gpu.sh"), "all"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=560)
    assert [p.name for p in device_out.iterdir()] == ["battery.tar.gz"], done.stdout[-2000:]
    out = tmp_path / "out"
    with tarfile.open(device_out / "battery.tar.gz") as tar:
        tar.extractall(out, filter="data")
    logs = {p.name: p.read_text()[-1500:] for p in out.glob("*.log")} if out.exists() else {}
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], logs)
    summary = json.loads((out / "battery.json").read_text())
    assert [entry["stage"] for entry in summary["stages"]] == list(STAGE_JSON)
    assert all(entry["status"] == "ok" for entry in summary["stages"]), summary
    assert summary["elapsed_s"] <= summary["budget_s"] <= 480  # billed the caps: the worst case
    for entry in summary["stages"]:
        assert entry["json"] == sorted(STAGE_JSON[entry["stage"]])
        for name in entry["json"]:
            assert json.loads((out / name).read_text())  # each parses
        assert (out / f"{entry['stage']}.log").exists()
    bf16, awq = (json.loads((out / f"throughput_qwen3-0.6b{tag}_cpu.json").read_text())
                 for tag in ("", "_awq_marlin"))
    assert bf16["config"]["quantization_config"] is None
    assert awq["config"]["quantization_config"]["quant_method"] == "awq"
    assert awq["environment"]["kvdeck_env"]["KVDECK_W4A16_KERNEL"] == "marlin"
    assert awq["config"]["weight_bytes_per_token"] < bf16["config"]["weight_bytes_per_token"]
    assert awq["kvdeck"]["output_tokens"] == bf16["kvdeck"]["output_tokens"]  # the same workload
    w4a16 = json.loads((out / "w4a16_cpu.json").read_text())
    assert w4a16["complete"] and [e["variant"] for e in w4a16["e2e_decode"]] == [
        "bf16", "awq_marlin", "awq_marlin_pdl", "bf16_pdl", "awq_marlin_unfused"]
    # The PDL twins (no GPU here: the plain launch) compute what their twins do, token for token.
    assert not [entry for entry in w4a16["e2e_decode"] if "error" in entry]
    # The INT4 engines serve their head in int8 (quant/int8_head.py), the bf16 ones dense.
    heads = [entry["output_head"] for entry in w4a16["e2e_decode"]]
    assert [head == "W8A16OutputHead" for head in heads] == [False, True, True, False, True], heads
    assert w4a16["summary"]["e2e_pdl"]["awq_marlin_pdl"]["batch_1_tokens_equal"] is True
    assert w4a16["summary"]["e2e_pdl"]["bf16_pdl"]["batch_2_tokens_equal"] is True
    # The AWQ engines apply the MLP's activation in the gate | up GEMM's epilogue, but the
    # `_unfused` twin (KVDECK_FUSED_ACTIVATION=0), which gives the same tokens.
    fused = [entry["fused_activation"] for entry in w4a16["e2e_decode"]]
    assert fused == [False, True, True, False, False], fused
    unfused = w4a16["summary"]["e2e_fused_activation"]["awq_marlin_unfused"]
    assert unfused["batch_1_tokens_equal"] is True and unfused["batch_2_tokens_equal"] is True
    # The widest shape timed as a gate | up layer at decode sizes, fused and not, both checked.
    gated = [row for row in w4a16["results"] if "marlin_gated_ms" in row]
    assert [(row["m"], row["n"]) for row in gated] == [(1, 256), (4, 256)]
    assert all(row["marlin_gated_max_abs_err"] < 1e-3 and "marlin_act_ms" in row for row in gated)
    assert set(w4a16["summary"]["gated_speedup_vs_unfused"]) == {"1", "4"}
    # The table's marlin path again under the sweep's pick, which e2e's marlin engine ran too,
    # and the targets judged on both (the tiny shapes measure only "every M").
    assert len(w4a16["marlin_tuned"]) == len(w4a16["results"])
    assert w4a16["e2e_decode"][1]["marlin_tuning"] == w4a16["marlin_tuned_entry"]["source"]
    for key in ("targets", "targets_tuned"):
        verdicts = w4a16["summary"][key]
        assert verdicts["gemm every M up to 512 >= 1.0x bf16"]["rows"] == len(w4a16["results"])
        assert verdicts["e2e batch-1 decode awq_marlin >= 2.0x bf16"]["ratio"] > 0
    # Each engine's batch-1 steps ran under the profiler too (no CUDA here: nothing recorded).
    for entry in w4a16["e2e_decode"]:
        profiled = entry["runs"][0]["kernels"]
        assert entry["runs"][0]["batch"] == 1 and profiled["steps"] == 2 and "note" in profiled, profiled
    assert all(row["marlin_max_abs_err"] < 1e-3 for row in w4a16["results"])  # both kernels checked
    # The anatomy ran last, one row per shape, every part checked and timed.
    assert [(row["k"], row["n"]) for row in w4a16["anatomy"]] == [(256, 128), (128, 256)]
    assert all("error" not in row and len(row["ms"]) == 6 for row in w4a16["anatomy"])
    graphs = json.loads((out / "cuda_graphs_cpu.json").read_text())
    assert graphs["greedy_sequences_equal"] == graphs["greedy_sequences"]
    assert graphs["lora_greedy_sequences_equal"] == graphs["greedy_sequences"]
    assert graphs["lora_adapter_graph_steps"] > 0
    lora = json.loads((out / "lora_gpu_cpu.json").read_text())
    assert lora["adapter_graphs_captured"] and lora["adapter_steps_on_graphs"] > 0
    assert lora["adapter_decode_steps_eager"] == 0 and lora["lora_over_base_median"] > 0
    # Whether the start-up warm-up covered the adapters' kernels (nothing compiles on the CPU).
    assert {"kernel_compiles_first_adapter_steps", "kernel_compiles_after_start"} <= set(lora)
    assert {side: figures["steps"] for side, figures in lora["kernels"].items()} == {"base": 10, "lora": 10}
    # The kernel sweep checked each candidate against the reference and named the fastest, which
    # the decode run then served.
    sweep = json.loads((out / "lora_kernels_cpu.json").read_text())
    assert not [row for row in sweep["rows"] if "error" in row] and len(sweep["rows"]) >= 4
    assert lora["config"]["lora_kernel_config"] == sweep["best"]
    assert sweep["pdl"]["config"] == sweep["best"] and sweep["pdl"]["pdl_speedup"] > 0
    assert all(row["ok"] for row in json.loads((out / "check_kernels_cpu.json").read_text())["checks"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["kernels", "profile", "decode"])
def test_the_stages_out_of_all_run_on_their_own(stage, tiny_llama_dir, tmp_path):
    # Their issues are resolved, so `all` leaves them out, but a lease may run them alone.
    python = f"{sys.executable} {REPO / 'tests' / 'bench' / 'python_on_gpu_image.py'}"
    env = {**os.environ, "PYTHON": python, "KVDECK_BATTERY_SMOKE": str(tiny_llama_dir)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "run_gpu.sh"), stage, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    if stage == "kernels":
        kernels = json.loads((tmp_path / "kernels_cpu.json").read_text())
        assert kernels["complete"] and kernels["timing"].startswith("fake clock")
        assert kernels["decode_attention"] and kernels["prefill_attention"] and kernels["elementwise"]
    elif stage == "decode":
        for name in ("decode_llama-3.2-1b_cpu.json", "decode_llama-3.2-1b_eager_cpu.json"):
            assert json.loads((tmp_path / name).read_text())["config"]
    else:
        profile = json.loads((tmp_path / "profile_decode_qwen3-0.6b_cpu.json").read_text())
        phases = profile["batches"]["1"]["step_phases_ms"]
        assert {"schedule", "prepare_inputs", "model_and_sampling", "update_outputs",
                "frontend"} <= set(phases)
        assert (tmp_path / "profile_decode_qwen3-0.6b_eager_cpu.json").exists()
        lora = json.loads((tmp_path / "profile_decode_qwen3-0.6b_lora_cpu.json").read_text())
        assert lora["config"]["lora_adapters"] == 8 and lora["config"]["engine"]["enable_lora"]
        assert lora["batches"]["64"]["ms_per_step"] > 0


def test_a_stage_past_its_cap_is_killed_with_its_children(tmp_path):
    script = tmp_path / "stages.sh"
    # A stage that starts a child and outlives its cap; the child would write a file later.
    script.write_text('sleep 30 && touch "$2/late" &\nsleep 30\n')
    started = time.monotonic()
    assert gpu_battery.run_stage(script, "slow", tmp_path, cap_s=1) == gpu_battery.TIMED_OUT
    assert time.monotonic() - started < 10
    assert (tmp_path / "slow.log").exists()
    script.write_text('echo "stage $1" > "$2/$1.json"\n')
    assert gpu_battery.run_stage(script, "quick", tmp_path, cap_s=10) == 0
    assert (tmp_path / "quick.json").read_text() == "stage quick\n"


def test_the_budget_is_never_overrun(tmp_path):
    stages = [("a", 200), ("b", 200), ("c", 200), ("d", 15)]
    clock = gpu_battery.FakeClock(stages)
    ran = []

    def run(stage: str, cap: float) -> int:
        ran.append((stage, cap))
        (tmp_path / f"{stage}.json").write_text("{}")
        return gpu_battery.TIMED_OUT if stage == "b" else 0

    summary = gpu_battery.run_battery(tmp_path, stages, clock.bill(run), clock, budget_s=480)
    # c gets what is left (80 s), d is skipped (nothing left), b's cut-off does not stop c.
    assert ran == [("a", 200), ("b", 200), ("c", 80)]
    assert [e["status"] for e in summary["stages"]] == ["ok", "cut off", "ok", "skipped"]
    assert summary["elapsed_s"] == 480
    assert [e.get("json") for e in summary["stages"]] == [["a.json"], ["b.json"], ["c.json"], None]
    assert json.loads((tmp_path / "battery.json").read_text()) == summary


def test_the_archive_holds_every_stage_written_so_far(tmp_path):
    out, archive = tmp_path / "work", tmp_path / "battery.tar.gz"
    out.mkdir()
    stages = [("a", 10), ("b", 10)]
    clock = gpu_battery.FakeClock(stages)
    packed = []

    def run(stage: str, cap: float) -> int:
        if archive.exists():  # what the archive held when this stage started
            with tarfile.open(archive) as tar:
                packed.append(sorted(tar.getnames()))
        (out / f"{stage}.json").write_text(f'{{"stage": "{stage}"}}')
        (out / f"{stage}.log").write_text("log")
        (out / "scratch.bin").write_text("not packed")
        return 0

    gpu_battery.run_battery(out, stages, clock.bill(run), clock, archive=archive)
    assert packed == [["a.json", "a.log", "battery.json"]]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["a.json", "a.log", "b.json", "b.log", "battery.json"]
        assert json.loads(tar.extractfile("b.json").read()) == {"stage": "b"}
    assert not list(tmp_path.glob("*.tmp"))
