"""How the repacked W4A16 kernel's launches are shaped (kernels/triton/w4a16_marlin_plan.py):
split-K counts that fill whole waves, the per-architecture table and the tool that writes it
from a GPU sweep (benchmarks/w4a16_tune.py); and the kernel, under the interpreter, at every
split count a launch can run."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from kvdeck.kernels.triton import w4a16_marlin_plan as plan

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import w4a16_tune  # noqa: E402

# Llama-3-8B's (K, N) at M = 1 with the decode bucket's tiles (block_n 64, block_k 128).
LLAMA_8B_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
H100_SLOTS = 132 * plan.PROGRAMS_PER_SM


def _brute_best(tiles: int, k_tiles: int, max_split: int, slots: int) -> float:
    allowed = [s for s in range(1, max_split + 1) if (s == 1 or k_tiles // s >= plan.MIN_K_TILES_PER_SPLIT)
               and plan.split_tiles(k_tiles, s)[1] == s]
    return max(plan.wave_efficiency(tiles, k_tiles, s, slots) for s in allowed)


def test_wave_efficiency_counts_partial_waves_and_uneven_splits():
    assert plan.wave_efficiency(66, 32, 4, 264) == 1.0  # 264 programs: one whole wave
    # 5 splits of 32 tiles run 7 tiles each, 330 programs in two waves of 264 slots.
    assert plan.wave_efficiency(66, 32, 5, 264) == pytest.approx(66 * 32 / (2 * 264 * 7))
    assert plan.split_tiles(10, 4) == (3, 4) and plan.split_tiles(10, 6) == (2, 5)


@pytest.mark.parametrize("slots", [1, 2, 78 * 2, 108 * 2, 132 * 2, 132 * 4])
@pytest.mark.parametrize("tiles", [1, 7, 32, 64, 224])
@pytest.mark.parametrize("k_tiles", [1, 3, 32, 112])
def test_choose_split_is_the_most_efficient_allowed_split(tiles, k_tiles, slots):
    split = plan.choose_split(tiles, k_tiles, 16, slots)
    assert 1 <= split <= 16 and (split == 1 or k_tiles // split >= plan.MIN_K_TILES_PER_SPLIT)
    assert plan.split_tiles(k_tiles, split)[1] == split  # the launch runs exactly this many
    assert math.isclose(plan.wave_efficiency(tiles, k_tiles, split, slots),
                        _brute_best(tiles, k_tiles, 16, slots))


@pytest.mark.parametrize("k,n", LLAMA_8B_SHAPES)
def test_llama_8b_decode_fills_whole_waves_on_an_h100(k, n):
    tiles, k_tiles = n // 64, k // 128
    split = plan.choose_split(tiles, k_tiles, 16, H100_SLOTS)
    assert plan.wave_efficiency(tiles, k_tiles, split, H100_SLOTS) > 0.95
    # The AWQ-layout kernel's rule (about two programs per SM, then evened) leaves a partial
    # second wave with these tiles: e.g. 448 programs in two waves of 264 on the 14336-wide layer.
    old = max(1, min(16, -(-H100_SLOTS // tiles), k_tiles // 2))
    old = -(-k_tiles // -(-k_tiles // old))
    assert plan.wave_efficiency(tiles, k_tiles, old, H100_SLOTS) < 0.9


def test_tuned_table_is_checked_and_leaves_other_buckets_alone(monkeypatch):
    fields = dict(block_m=16, block_n=128, block_k=128, split_k=8, num_warps=8, num_stages=5)
    entry = {"buckets": ((16, fields),), "programs_per_sm": 3, "fused_max_tokens": 64, "source": "t"}
    tuned = plan.tuning_from_table(entry)
    assert tuned.buckets[0] == (16, plan.MarlinConfig(**fields))
    assert tuned.buckets[1:] == plan.M_BUCKETS[1:] and tuned.fused_max_tokens == 64
    monkeypatch.setitem(plan._TUNINGS, 90, tuned)
    config = plan.choose_config(1, 4096, 4096, 128, num_sms=132, arch=90)
    assert (config.block_n, config.num_stages) == (128, 5) and config.split_k <= 8
    assert plan.choose_config(1, 4096, 4096, 128, num_sms=132, arch=80) == plan.choose_config(
        1, 4096, 4096, 128, num_sms=132)  # no table for sm_80: the defaults
    assert plan.tuning(None) is plan.DEFAULT_TUNING
    with pytest.raises(ValueError, match="bucket limits"):
        plan.tuning_from_table({"buckets": ((48, fields),)})
    with pytest.raises(ValueError, match="fused_max_tokens"):
        plan.tuning_from_table({"fused_max_tokens": 100})


def _sweep_result() -> dict:
    """A sweep JSON as a GPU run writes it, with made-up times that single out a winner."""
    rows, table = [], []
    good, default = [16, 128, 128, 16, 8, 4], [16, 64, 128, 16, 4, 4]
    for k, n in LLAMA_8B_SHAPES:
        for m in (1, 16):
            for values, ms in ((default, 2.0), (good, 1.0)):
                rows.append({"kind": "config", "m": m, "k": k, "n": n, "values": values, "ms": ms,
                             "bf16_ms": 4.0})
            tiles, k_tiles = n // 64, k // 128
            for split in (1, 2, 4, 8, 16):  # fastest where 4 programs per SM would pick
                pick = plan.choose_split(tiles, k_tiles, 16, 4 * 132)
                rows.append({"kind": "split", "m": m, "k": k, "n": n, "tiles": tiles, "k_tiles": k_tiles,
                             "num_sms": 132, "split": split, "ms": 1.0 if split == pick else 1.5,
                             "bf16_ms": 4.0, "wave_efficiency": {"1": 0.5, "2": 0.5, "4": 0.5}})
        for m in (32, 64, 256, 512):
            rows.append({"kind": "large", "m": m, "k": k, "n": n, "path": "dequant", "ms": 1.0,
                         "bf16_ms": 1.0})
            for bucket, values in ((64, [64, 128, 64, 4, 8, 3]), (256, [128, 128, 64, 2, 8, 3])):
                rows.append({"kind": "large", "m": m, "k": k, "n": n, "path": "fused", "bucket": bucket,
                             "values": values, "ms": 0.9 if m <= 64 else 1.2, "bf16_ms": 1.0})
        # Bucket 32: the second candidate wins; a third ran at one shape only (the GPU refused
        # it at the others) and cannot be picked, however fast.
        for values, ms in (([32, 64, 128, 8, 4, 4], 0.8), ([32, 128, 128, 8, 4, 4], 0.7)):
            rows.append({"kind": "large", "m": 32, "k": k, "n": n, "path": "fused", "bucket": 32,
                         "values": values, "ms": ms, "bf16_ms": 1.0})
        if (k, n) == LLAMA_8B_SHAPES[0]:
            rows.append({"kind": "large", "m": 32, "k": k, "n": n, "path": "fused", "bucket": 32,
                         "values": [32, 256, 128, 8, 8, 4], "ms": 0.1, "bf16_ms": 1.0})
        else:
            rows.append({"kind": "error", "m": 32, "k": k, "n": n, "candidate": "bucket32_2",
                         "error": "OutOfResources: shared memory"})
        for m in (1, 16, 64, 256):
            table.append({"m": m, "k": k, "n": n, "bf16_ms": 4.0, "marlin_ms": 1.0 if m <= 64 else 5.0,
                          "triton_ms": 2.0 if m <= 64 else 6.0, "marlin_dequant_ms": 3.0, "dequant_ms": 3.5})
    return {"sm": 90, "device": "NVIDIA H100", "commit": "abc", "results": table, "marlin_sweep": rows}


def test_tune_picks_winners_and_writes_a_table_the_kernel_reads(tmp_path, capsys):
    result = _sweep_result()
    profiled = {"steps": 32, "wall_ms_per_step": 1.0, "kernels_per_step": 170.0, "busy_ms_per_step": 0.8,
                "by_kind": {"gemm": {"ms_per_step": 0.5, "launches_per_step": 65.0}}}
    result["e2e_decode"] = [{"variant": "bf16", "runs": [{"batch": 1, "output_tokens_per_s": 900.0,
                                                          "kernels": profiled}]}]
    summary = w4a16_tune.summarise_table(result["results"])
    assert summary["w4a16_auto"] == "marlin"
    assert summary["winners_by_m"]["1"]["winner"] == "marlin"
    assert summary["winners_by_m"]["256"]["winner"] == "dequant+cublas"
    tuned = w4a16_tune.summarise_sweep(result["marlin_sweep"], result["results"])["tuned"]
    assert tuned["buckets"][0] == [16, [16, 128, 128, 16, 8, 4]]
    assert tuned["buckets"][1] == [32, [32, 128, 128, 8, 4, 4]]
    assert [limit for limit, _ in tuned["buckets"]] == [16, 32, 64, 256]
    assert tuned["programs_per_sm"] == 4
    assert tuned["fused_max_tokens"] == 64  # fused wins at 64, dequantise + cuBLAS at 256
    path = tmp_path / "json.json"
    path.write_text(json.dumps(result))
    table = tmp_path / "tuned.py"
    table.write_text('"""header"""\n\nTUNED: dict[int, dict] = {}\n')
    choice = tmp_path / "w4a16_choice.py"
    choice.write_text((REPO / "kernels" / "w4a16_choice.py").read_text().replace(
        'W4A16_AUTO = "marlin"', 'W4A16_AUTO = "awq"'))
    assert w4a16_tune.main([str(path), "--table", str(table), "--choice", str(choice)]) == 0
    assert '\nW4A16_AUTO = "marlin"\n' in choice.read_text()
    assert ("e2e bf16 batch 1 profiled: 1.000 ms a step, device busy 0.800, 170 kernels; gemm 0.500 (65)"
            in capsys.readouterr().out)
    namespace: dict = {}
    exec(table.read_text(), namespace)
    tuning = plan.tuning_from_table(namespace["TUNED"][90])
    assert tuning.programs_per_sm == 4 and tuning.fused_max_tokens == 64
    assert tuning.buckets[0][1] == plan.MarlinConfig(16, 128, 128, 16, 8, 4)
    assert table.read_text().startswith('"""header"""')
    result["sm"] = None  # a CPU smoke run: nothing to tune
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match="SM version"):
        w4a16_tune.main([str(path), "--table", str(table), "--dry-run"])


@pytest.mark.parametrize("gemv_ms", [0.5, 1.5])
def test_tune_serves_batch_1_the_gemv_form_only_where_it_beat_the_bucket(gemv_ms):
    import w4a16_sweep

    result = _sweep_result()
    gemv_default, gemv_other = (list(v) for v in w4a16_sweep.GEMV_CONFIGS[:2])
    for k, n in LLAMA_8B_SHAPES:  # timed at M = 1 beside the bucket's configs (whose best ran 1.0)
        for values, ms in ((gemv_default, 3.0), (gemv_other, gemv_ms)):
            result["marlin_sweep"].append({"kind": "gemv", "m": 1, "k": k, "n": n, "values": values,
                                           "ms": ms, "bf16_ms": 4.0})
    tuned = w4a16_tune.summarise_sweep(result["marlin_sweep"], result["results"])["tuned"]
    assert tuned["gemv"] == gemv_other and tuned["bucket16_at_gemv_m_speedup_vs_bf16"] == 4.0
    assert tuned["gemv_max_tokens"] == (1 if gemv_ms < 1.0 else 0)
    tuning = plan.tuning_from_table(w4a16_tune.entry_from_sweep(tuned, "test"))
    assert tuning.gemv == plan.MarlinConfig(*gemv_other) and tuning.gemv.gemv
    assert plan._fitted_config(1, 4096, 4096, 128, 132, tuning).gemv == (gemv_ms < 1.0)
    assert not plan._fitted_config(2, 4096, 4096, 128, 132, tuning).gemv


def test_a_sweep_candidate_that_fails_leaves_an_error_row_and_the_rest_run():
    import w4a16_sweep

    def refused():
        raise RuntimeError("out of resource: shared memory, Required: 300000")

    right = torch.ones(2, 2)
    checked = []

    def check(name, out, reference):
        checked.append(name)
        if not torch.equal(out, reference):
            raise AssertionError(f"{name} wrong")

    fns = {"bf16": lambda: right, "config0": lambda: right, "config1": refused,
           "config2": lambda: 2 * right}
    kept, errors = w4a16_sweep._runnable(fns, check, 32, 4096, 4096, right)
    assert list(kept) == ["bf16", "config0"]
    assert [(e["candidate"], e["error"].split(":")[0]) for e in errors] == [
        ("config1", "RuntimeError"), ("config2", "AssertionError")]
    assert all(e["kind"] == "error" and e["m"] == 32 for e in errors)
    with pytest.raises(RuntimeError, match="shared memory"):  # the yardstick itself must run
        w4a16_sweep._runnable({"bf16": refused}, check, 32, 4096, 4096, right)


def test_auto_follows_the_tuned_figures_and_names_the_awq_kernel(tmp_path):
    table = _sweep_result()["results"]
    assert w4a16_tune.summarise_table(table)["w4a16_auto"] == "marlin"  # 4x against triton's 2x
    # Under the sweep's pick marlin runs 1.5x bf16, slower than the AWQ layout's 2x: awq, by
    # KVDECK_W4A16_KERNEL's name for it (the table calls it triton).
    tuned = [{"m": row["m"], "k": row["k"], "n": row["n"], "marlin_speedup_vs_bf16": 1.5} for row in table]
    summary = w4a16_tune.summarise_table(table, tuned)
    assert summary["w4a16_auto"] == "awq"
    assert summary["winners_by_m"]["1"]["speedup_vs_bf16"]["marlin"] == 1.5
    choice = tmp_path / "w4a16_choice.py"
    choice.write_text('"""doc"""\n\nW4A16_AUTO = "marlin"\nW4A16_METHODS = ("awq",)\n')
    assert w4a16_tune.write_auto("awq", choice) and not w4a16_tune.write_auto("awq", choice)
    assert choice.read_text() == '"""doc"""\n\nW4A16_AUTO = "awq"\nW4A16_METHODS = ("awq",)\n'
    choice.write_text("nothing to set\n")
    with pytest.raises(ValueError, match="no W4A16_AUTO line"):
        w4a16_tune.write_auto("awq", choice)


def test_use_tuning_serves_an_arch_at_once_and_the_cpu_too(monkeypatch):
    monkeypatch.setattr(plan, "_TUNINGS", dict(plan._TUNINGS))  # the test's own table
    before = plan.choose_config(1, 4096, 4096, 128, num_sms=132, arch=90)  # cached on the old tuning
    fields = dict(block_m=16, block_n=128, block_k=128, split_k=8, num_warps=8, num_stages=5)
    chosen = plan.use_tuning(90, {"buckets": ((16, fields),), "fused_max_tokens": 32, "source": "run"})
    after = plan.choose_config(1, 4096, 4096, 128, num_sms=132, arch=90)
    assert before.block_n == 64 and (after.block_n, after.num_stages) == (128, 5)
    assert plan.tuning(90) is chosen and chosen.source == "run"
    assert plan.tuning(None) is plan.DEFAULT_TUNING  # only what was asked for changes
    plan.use_tuning(None, {"fused_max_tokens": 0})  # the interpreter's runs (the smoke bench)
    assert plan.tuning(None).fused_max_tokens == 0
    with pytest.raises(ValueError, match="fused_max_tokens"):
        plan.use_tuning(90, {"fused_max_tokens": 100})
    assert plan.tuning(90) is chosen  # a refused entry leaves the last one serving


def test_targets_take_the_worst_row_of_each_and_e2e_at_batch_1():
    rows = [{"m": m, "k": k, "n": n, "marlin_speedup_vs_bf16": speedup}
            for (k, n), m, speedup in (((4096, 14336), 1, 3.1), ((14336, 4096), 16, 2.4),
                                       ((4096, 4096), 1, 1.9), ((4096, 4096), 512, 1.05))]
    e2e = [{"variant": variant, "runs": [{"batch": 1, "output_tokens_per_s": tps},
                                         {"batch": 16, "output_tokens_per_s": 10 * tps}]}
           for variant, tps in (("bf16", 100.0), ("awq_marlin", 230.0))]
    verdicts = w4a16_tune.targets(rows, e2e)
    assert verdicts["gemm M <= 16 on 4096x14336 and 14336x4096 >= 2.5x bf16"] == {
        "worst": 2.4, "rows": 2, "met": False}
    assert verdicts["gemm M <= 16 on 4096x4096 >= 1.8x bf16"] == {"worst": 1.9, "rows": 1, "met": True}
    assert verdicts["gemm every M up to 512 >= 1.0x bf16"] == {"worst": 1.05, "rows": 4, "met": True}
    assert verdicts["e2e batch-1 decode awq_marlin >= 2.0x bf16"] == {"ratio": 2.3, "met": True}
    unmeasured = w4a16_tune.targets([], e2e[:1])  # a run cut before its rows and its marlin engine
    assert all(figures["met"] is None for figures in unmeasured.values())
    lines = w4a16_tune.report({"targets": verdicts, "targets_tuned": unmeasured})
    assert sum("MISSED" in line for line in lines) == 1 and sum("not measured" in line for line in lines) == 6
    # With PDL (w4a16_e2e.py's `_pdl` engines): the target judged on that pair too, and each
    # one's effect over its plain twin, tokens compared.
    runs = lambda tps, tokens: [{"batch": 1, "output_tokens_per_s": tps, "tokens": tokens},  # noqa: E731
                                {"batch": 16, "output_tokens_per_s": 10 * tps}]
    e2e = [{"variant": "bf16", "runs": runs(100.0, [1, 2])},
           {"variant": "awq_marlin", "runs": runs(150.0, [3])},
           {"variant": "awq_marlin_pdl", "runs": runs(180.0, [3])},
           {"variant": "bf16_pdl", "runs": runs(110.0, [1, 5])}]
    verdicts = w4a16_tune.targets([], e2e)
    assert verdicts["e2e batch-1 decode awq_marlin >= 2.0x bf16"] == {"ratio": 1.5, "met": False}
    assert verdicts["e2e batch-1 decode awq_marlin >= 2.0x bf16 (both with PDL)"] == {
        "ratio": 1.636, "met": False}
    assert w4a16_tune.pdl_effect(e2e) == {
        "awq_marlin_pdl": {"batch_1_speedup": 1.2, "batch_1_tokens_equal": True, "batch_16_speedup": 1.2},
        "bf16_pdl": {"batch_1_speedup": 1.1, "batch_1_tokens_equal": False, "batch_16_speedup": 1.1}}
    lines = w4a16_tune.report({"e2e_pdl": w4a16_tune.pdl_effect(e2e)})
    assert any(line.startswith("pdl bf16_pdl over its plain twin") for line in lines)
    # The verdict on KVDECK_PDL's default: bf16_pdl's tokens differ here, so not yet.
    assert lines[-1] == "PDL: keep off and find why: bf16_pdl gave other tokens than its twin"


def test_the_pdl_verdict_wants_both_engines_faster_with_equal_tokens():
    def effect(awq: float, bf16: float, equal: bool = True) -> dict:
        return {"awq_marlin_pdl": {"batch_1_speedup": awq, "batch_1_tokens_equal": equal},
                "bf16_pdl": {"batch_1_speedup": bf16, "batch_1_tokens_equal": True}}

    assert w4a16_tune.pdl_verdict(effect(1.08, 1.03)) == (
        "PDL: make KVDECK_PDL=1 the default (awq_marlin_pdl 1.080x, bf16_pdl 1.030x, tokens equal)")
    assert w4a16_tune.pdl_verdict(effect(1.08, 1.01)).startswith("PDL: keep off (awq_marlin_pdl 1.080x")
    assert "gave other tokens" in w4a16_tune.pdl_verdict(effect(1.2, 1.2, equal=False))
    refused = {"awq_marlin_pdl": {"error": "CUDA error: operation not supported"}, "bf16_pdl": {}}
    assert w4a16_tune.pdl_verdict(refused) == ("PDL: keep off (a PDL engine did not run: awq_marlin_pdl: "
                                               "CUDA error: operation not supported)")


def test_the_fused_activation_verdict_wants_equal_tokens_and_no_faster_unfused_twin():
    runs = lambda tps, tokens: [{"batch": 1, "output_tokens_per_s": tps, "tokens": tokens}]  # noqa: E731
    e2e = [{"variant": "awq_marlin", "runs": runs(100.0, [3, 4])},
           {"variant": "awq_marlin_unfused", "runs": runs(95.0, [3, 4])}]
    effect = w4a16_tune.twin_effect(e2e, "_unfused")
    assert effect == {"awq_marlin_unfused": {"batch_1_speedup": 0.95, "batch_1_tokens_equal": True}}
    lines = w4a16_tune.report({"e2e_fused_activation": effect})
    assert lines == [
        'awq_marlin_unfused over the fused engine: {"batch_1_speedup": 0.95, "batch_1_tokens_equal": true}',
        "fused activation: keep on (the unfused engine 0.950x at batch 1, tokens equal)"]
    faster = {"awq_marlin_unfused": {"batch_1_speedup": 1.05, "batch_1_tokens_equal": True}}
    assert w4a16_tune.fused_activation_verdict(faster).startswith("fused activation: turn off, the unfused")
    other = {"awq_marlin_unfused": {"batch_1_speedup": 0.9, "batch_1_tokens_equal": False}}
    assert "find why" in w4a16_tune.fused_activation_verdict(other)
    assert w4a16_tune.fused_activation_verdict({}) == "fused activation: not measured"
    # The gate | up rows of the table: the unfused pair's time over the gated launch's.
    rows = [{"m": 1, "bf16_ms": 1.0, "marlin_ms": 0.5, "marlin_act_ms": 0.6, "marlin_gated_ms": 0.5}]
    assert w4a16_tune.summarise_table(rows)["gated_speedup_vs_unfused"] == {"1": 1.2}


@pytest.fixture(scope="module")
def marlin():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernel under TRITON_INTERPRET=1")
    from kvdeck.kernels.triton import w4a16_marlin

    return w4a16_marlin


@pytest.mark.parametrize("symmetric", [False, True])
def test_every_runnable_split_count_matches_the_reference(marlin, symmetric):
    from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq
    from kvdeck.kernels.reference.w4a16_repack import repack_awq
    from tests.quant.test_w4a16_marlin import _random_awq

    k, n, group = 256, 72, 32
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, 21, symmetric)
    repacked = repack_awq(qweight, qzeros, scales, group)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(3))
    expected = x.double() @ dequantize_awq(qweight, qzeros, scales, group).double()
    base = plan.MarlinConfig(block_m=16, block_n=64, block_k=32, split_k=1, num_warps=4, num_stages=2)
    k_tiles = k // base.block_k
    splits = [s for s in range(1, k_tiles + 1)
              if (s == 1 or k_tiles // s >= 2) and plan.split_tiles(k_tiles, s)[1] == s]
    assert splits == [1, 2, 3, 4]
    for split in splits:
        out = marlin.w4a16_matmul_marlin(x, repacked, config=plan.MarlinConfig(**{
            **{f: getattr(base, f) for f in plan.CONFIG_FIELDS}, "split_k": split}))
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-3)
