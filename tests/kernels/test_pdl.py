"""Programmatic dependent launch (kernels/triton/pdl.py, kernels/triton/launch.py): which
launches get it (KVDECK_PDL=1, a CUDA device of sm_90 or later, never the interpreter), and
that every kvdeck kernel takes the switch and waits before its first load or store."""

import ast
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import TILE_N
from kvdeck.kernels.triton import launch as launch_module
from kvdeck.kernels.triton import rmsnorm
from kvdeck.kernels.triton.launch import pdl_forced, pdl_setting
from kvdeck.kernels.triton.w4a16_layout import prefetch_words

KERNEL_DIR = Path(launch_module.__file__).parent


@triton.jit
def _touch(sink_ptr, K, N, k_per_split, stride, BLOCK_N: tl.constexpr, TILE: tl.constexpr):
    """The W4A16 kernels' weight prefetch, each address counted in `sink` instead."""
    prefetch_words(sink_ptr, tl.program_id(0), tl.program_id(1), k_per_split, K, N, stride, BLOCK_N, TILE,
                   RECORD=True)


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("0", False), ("1", True), ("", False),
                                                 (" 1 ", True)])
def test_the_setting_is_off_unless_asked(value, expected):
    environ = {} if value is None else {"KVDECK_PDL": value}
    assert pdl_setting(environ) is expected


@pytest.mark.parametrize("value", ["2", "yes", "on"])
def test_a_bad_setting_is_a_clear_error(value):
    with pytest.raises(ValueError, match=f"KVDECK_PDL must be 0 or 1, got '{value}'"):
        pdl_setting({"KVDECK_PDL": value})


@pytest.fixture
def hopper(monkeypatch):
    """launch.py as on a GPU (not interpreting) whose CUDA devices are sm_`arch`."""
    def use(arch: int) -> None:
        monkeypatch.setattr(launch_module, "INTERPRETING", False)
        monkeypatch.setattr(launch_module, "device_arch",
                            lambda device: arch if device.type == "cuda" else None)
    return use


class _FakeTensor(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA device (no GPU here)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def _cuda_like() -> torch.Tensor:
    return torch.zeros(4).as_subclass(_FakeTensor)


def test_launches_on_hopper_get_pdl_when_asked(hopper):
    hopper(90)
    kernel = rmsnorm._rms_norm_kernel
    args = (_cuda_like(), 3, 4.0)
    assert launch_module._pdl_kwargs(kernel, args) == {}  # the environment says nothing: off
    with pdl_forced(True):
        assert launch_module._pdl_kwargs(kernel, args) == {"PDL": True, "launch_pdl": True}
        with pdl_forced(False):  # the innermost wins
            assert launch_module._pdl_kwargs(kernel, args) == {}
        assert launch_module._pdl_kwargs(kernel, (torch.zeros(2), 1)) == {}  # a CPU tensor
        assert launch_module._pdl_kwargs(kernel, (3, 4.0)) == {}  # no tensor: no device to ask
    assert launch_module._pdl_kwargs(kernel, args) == {}
    # As a decorator (the benchmarks' PDL side of a graph): on for every call, off after.
    forced = pdl_forced(True)(lambda: launch_module._pdl_kwargs(kernel, args))
    assert forced() == forced() == {"PDL": True, "launch_pdl": True}
    assert launch_module._pdl_kwargs(kernel, args) == {}


def test_no_pdl_before_hopper_or_for_a_kernel_without_the_switch(hopper):
    hopper(89)
    with pdl_forced(True):
        assert launch_module._pdl_kwargs(rmsnorm._rms_norm_kernel, (_cuda_like(),)) == {}
    hopper(90)

    class NoSwitch:
        arg_names = ["x_ptr", "n", "BLOCK"]
        __hash__ = object.__hash__

    with pdl_forced(True):
        assert launch_module._pdl_kwargs(NoSwitch(), (_cuda_like(),)) == {}


def test_the_interpreter_never_gets_pdl_and_computes_alike():
    # On the CPU (TRITON_INTERPRET=1) forcing it changes nothing: griddepcontrol is a GPU's.
    x, weight = torch.randn(3, 64), torch.randn(64)
    with pdl_forced(True):
        assert launch_module._pdl_kwargs(rmsnorm._rms_norm_kernel, (x,)) == {}
        forced = rmsnorm.rms_norm_triton(x, weight, 1e-6)
    assert torch.equal(forced, rmsnorm.rms_norm_triton(x, weight, 1e-6))


def _kernels() -> list[tuple[str, ast.FunctionDef]]:
    """Every Triton kernel (a decorated `*_kernel` function) in kernels/triton."""
    found = []
    for path in sorted(KERNEL_DIR.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and node.decorator_list:
                found.append((f"{path.name}:{node.name}", node))
    return found


MEMORY_OPS = ("tl.load", "tl.store", "tl.atomic", "load_", "_finish_tile", "tl.inline_asm")


def test_every_kernel_takes_the_switch_and_waits_before_anything_else():
    kernels = _kernels()
    assert len(kernels) >= 15
    prefetching = set()
    for where, node in kernels:
        last = node.args.args[-1]
        assert last.arg == "PDL" and ast.unparse(last.annotation) == "tl.constexpr", where
        assert ast.unparse(node.args.defaults[-1]) == "False", where  # off unless launch() says
        body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value,
                                                                                  ast.Constant) else node.body
        waits = [i for i, statement in enumerate(body) if ast.unparse(statement) == "pdl_start(PDL)"]
        assert len(waits) == 1, where
        # Before the wait: program ids, and under PDL only the weights' L2 prefetch.
        for statement in body[: waits[0]]:
            text = ast.unparse(statement)
            assert not any(op in text for op in MEMORY_OPS), (where, text)
            if isinstance(statement, ast.If):
                assert ast.unparse(statement.test) == "PDL" and "prefetch_words(" in text, (where, text)
                prefetching.add(node.name)
            else:
                assert isinstance(statement, ast.Assign) and "tl.program_id" in text, (where, text)
    assert prefetching == {"_w4a16_marlin_kernel", "_w4a16_gemv_kernel"}


def test_the_prefetch_only_asks_l2_for_weights():
    # It runs before the wait: no load, no store, one asm statement that is a prefetch.
    from kvdeck.kernels.triton import w4a16_layout

    source = ast.unparse(next(node for node in ast.parse(Path(w4a16_layout.__file__).read_text()).body
                              if isinstance(node, ast.FunctionDef) and node.name == "prefetch_words"))
    assert "tl.load" not in source and "tl.store" not in source
    assert source.count("tl.atomic_add") == 1 and "if RECORD:" in source  # the tests' recording only
    assert source.count("tl.inline_asm_elementwise(_PREFETCH_L2_ASM") == 1
    assert w4a16_layout.PREFETCH_L2_ASM.startswith("prefetch.global.L2 [$1];")


@pytest.mark.parametrize(("k", "n", "block_n", "split"), [(256, 128, 128, 1), (512, 192, 128, 4),
                                                          (1024, 64, 64, 3), (2048, 320, 256, 2)])
def test_the_prefetch_covers_each_programs_weights_and_nothing_past_them(k, n, block_n, split):
    # Every 128-byte line of the packed words of the columns that exist, over the launch's
    # programs; no address outside qweight [N_pad/TILE, K/8, TILE] (past N: the padding tile of
    # the last program, which must not be named).
    tiles = -(-n // TILE_N)
    sink = torch.zeros(tiles + 1, k // 8, TILE_N, dtype=torch.int32)  # a guard tile past the weights
    k_per_split = -(-k // split // 128) * 128
    grid = (-(-n // block_n), -(-k // k_per_split))
    _touch[grid](sink, k, n, k_per_split, sink.stride(0), BLOCK_N=block_n, TILE=TILE_N)
    lines = sink[:tiles].reshape(tiles, -1, 32)  # [tile, 128-byte line, word]
    untouched = (lines.sum(dim=2) == 0).nonzero()
    assert untouched.numel() == 0, untouched[:5]
    assert sink[tiles].sum() == 0  # nothing past the last tile of real columns
    # One address a line, but for a step's tail, which repeats the last line (64 lines a step).
    programs_tiles = grid[0] * grid[1] * max(1, block_n // TILE_N)
    assert int(lines.sum()) < lines.shape[0] * lines.shape[1] + 64 * programs_tiles
