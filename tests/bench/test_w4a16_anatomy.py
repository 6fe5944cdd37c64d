"""The W4A16 anatomy's part-kernels (benchmarks/w4a16_anatomy.py) under the Triton interpreter:
what they compute is checked against torch before a GPU times them, so the check must pass on
the kernels and fail on a wrong product."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import w4a16_anatomy  # noqa: E402
import w4a16_problem  # noqa: E402
import w4a16_sweep  # noqa: E402

from kvdeck.kernels.triton import w4a16_marlin as marlin  # noqa: E402


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    return w4a16_problem.Problem.make(512, 192, "cpu", torch.float32)


@pytest.mark.parametrize("block_k", [64, 128])
@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 3])
def test_the_stream_kernel_and_its_split_epilogue_fold_what_torch_folds(problem, split, m, block_k):
    x, _ = problem.input(m)
    config = marlin.MarlinConfig(16, 64, block_k, split, 4, 2)
    launches = w4a16_anatomy.Launches(x, problem.repacked, config)
    assert launches.grid == (1, 3, split)
    want = w4a16_anatomy.folds(launches)  # [1, 3, split]
    assert want.shape == (1, 3, split) and len(set(want.flatten().tolist())) == 3 * split
    partial = launches.stream().clone()
    for split_index in range(split):
        for tile in range(3):  # every element of a program's tile holds its fold
            block = partial[split_index, :, tile * 64:(tile + 1) * 64].double()
            torch.testing.assert_close(block, torch.full_like(block, want[0, tile, split_index]),
                                       rtol=1e-5, atol=1e-4)
    out = launches.stream(fixup=True).clone()
    for tile in range(3):
        block = out[:, tile * 64:(tile + 1) * 64].double()
        torch.testing.assert_close(block, torch.full_like(block, want[0, tile].sum()), rtol=1e-5, atol=1e-4)
    w4a16_anatomy.check_launches(launches)
    launches.empty()  # the launch floor's kernel runs on the same grid


def test_the_check_fails_on_a_wrong_fold(problem, monkeypatch):
    x, _ = problem.input(1)
    launches = w4a16_anatomy.Launches(x, problem.repacked, marlin.MarlinConfig(16, 64, 128, 2, 4, 2))
    right = w4a16_anatomy.folds
    monkeypatch.setattr(w4a16_anatomy, "folds", lambda parts: right(parts) + 1.0)
    with pytest.raises(AssertionError, match="stream kernel's fold is off"):
        w4a16_anatomy.check_launches(launches)


def test_a_row_per_shape_with_every_part_timed_and_an_error_row_for_a_wrong_part(
        problem, monkeypatch):
    timer = lambda fns: w4a16_sweep.time_alternating(fns, "fake", 1.0)  # noqa: E731
    cpu, check = torch.device("cpu"), w4a16_problem.checker()
    (row,) = w4a16_anatomy.anatomy_rows({(512, 192): problem}, cpu, timer, check)
    assert "error" not in row
    assert set(row["ms"]) == {"bf16", "launch", "stream", "stream_deep", "stream_fixup", "marlin"}
    assert row["programs"] == 3 * row["split"]
    w = problem.repacked
    assert row["weight_bytes"] == sum(t.numel() * t.element_size() for t in (w.qweight, w.scales, w.zeros))
    assert w4a16_anatomy.describe(row).startswith("anatomy M=1 K=512 N=192 split")
    # A part-kernel that goes wrong leaves that shape's row saying so, and no raise.
    monkeypatch.setattr(w4a16_anatomy, "folds", lambda parts: torch.zeros(parts.grid, dtype=torch.float64))
    (row,) = w4a16_anatomy.anatomy_rows({(512, 192): problem}, cpu, timer, check)
    assert row["error"].startswith("AssertionError: the stream kernel's fold is off")
    assert "ms" not in row and "anatomy M=1 K=512 N=192: " in w4a16_anatomy.describe(row)


def test_resident_programs_follow_the_occupancy_rules(monkeypatch):
    h200 = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                           max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: h200)
    cuda = torch.device("cuda", 0)
    # The decode kernel on sm_90 (88 registers, 25 KB): registers bind, 2816 a warp -> 5.
    assert w4a16_anatomy.resident_programs({"registers": 88, "shared_bytes": 25152}, 4, cuda) == 5
    # 63 registers (2048 a warp) and 25.7 KB: 8 by registers, 8 by shared memory.
    assert w4a16_anatomy.resident_programs({"registers": 63, "shared_bytes": 25664}, 4, cuda) == 8
    # 59 KB of shared memory binds first.
    assert w4a16_anatomy.resident_programs({"registers": 63, "shared_bytes": 59200}, 4, cuda) == 3
    assert w4a16_anatomy.resident_programs({}, 4, cuda) is None
    off_cuda = torch.device("cpu")
    assert w4a16_anatomy.resident_programs({"registers": 63, "shared_bytes": 1}, 4, off_cuda) is None
