"""Kernels that do not recompile as batches change, and the count of those that compile.

`jit(do_not_specialize=...)` is `triton.jit` with the batch-dependent ints (token and
sequence counts, a block table's row stride) named: Triton then compiles one variant for
every value instead of one each for 1, multiples of 16 and the rest. `launch(kernel, grid,
...)` launches; under the interpreter it also works out the launch's specialisation key as
Triton's launcher would and counts a new one as a compile (kernels/compile_counter.py). On
a GPU Triton's own post-compile hook counts (installed on import, chained to any other).

Programmatic dependent launch (kernels/triton/pdl.py): a kernel with a `PDL` constexpr is
launched with it on where `pdl_enabled` says (KVDECK_PDL=1, sm_90 or later); off by default
until a GPU run has measured it (benchmarks/w4a16_e2e.py's `_pdl` variants).
"""

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import triton

from kvdeck.kernels.compile_counter import COMPILES
from kvdeck.kernels.ops import env_switch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # what triton.jit decided at import
PDL_ENV = "KVDECK_PDL"
PDL_MIN_ARCH = 90  # griddepcontrol: Hopper and later (ptxas refuses it for sm_80-89)
# Kernel (function name) -> its ints that are never specialised.
NOT_SPECIALISED: dict[str, frozenset[str]] = {}


def jit(*, do_not_specialize: tuple[str, ...] = ()):
    """triton.jit, remembering which ints the kernel leaves unspecialised."""
    def decorate(fn):
        NOT_SPECIALISED[fn.__name__] = frozenset(do_not_specialize)
        return triton.jit(do_not_specialize=list(do_not_specialize))(fn)
    return decorate


@functools.cache
def device_arch(device: torch.device) -> int | None:
    """The SM version of a CUDA device (90 for sm_90), whose tuned configs apply; None else."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def pdl_setting(environ=os.environ) -> bool:
    """KVDECK_PDL: 1 launches kernels with programmatic dependent launch where the GPU has it,
    0 (the default) never."""
    return env_switch(PDL_ENV, False, environ)


_PDL_FORCED: list[bool] = []  # pdl_forced's stack: the innermost wins over the environment


@functools.cache
def _pdl_from_environment() -> bool:
    return pdl_setting()


def _pdl_wanted() -> bool:
    return _PDL_FORCED[-1] if _PDL_FORCED else _pdl_from_environment()


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` use programmatic dependent launch."""
    return (_pdl_wanted() and not INTERPRETING and device.type == "cuda"
            and (device_arch(device) or 0) >= PDL_MIN_ARCH)


@contextlib.contextmanager
def pdl_forced(enabled: bool) -> Iterator[None]:
    """PDL on or off for the launches inside the block, whatever KVDECK_PDL says (the
    benchmarks capture a graph of each side); as a decorator, for every call of a function."""
    _PDL_FORCED.append(enabled)
    try:
        yield
    finally:
        _PDL_FORCED.pop()


@functools.cache
def _takes_pdl(kernel) -> bool:
    return "PDL" in kernel.arg_names


def _pdl_kwargs(kernel, args: tuple) -> dict:
    """{"PDL": True, "launch_pdl": True} for a kernel with the constexpr on a device that
    uses PDL, else nothing (the constexpr's default, off)."""
    if not _pdl_wanted() or not _takes_pdl(kernel):  # the setting first: off costs one call
        return {}
    device = next((arg.device for arg in args if isinstance(arg, torch.Tensor)), None)
    return {"PDL": True, "launch_pdl": True} if device is not None and pdl_enabled(device) else {}


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs): positional args are the kernel's runtime arguments,
    keywords its constexprs and launch options (PDL's are added here). Returns what
    Triton's launch does (on a GPU the compiled kernel: its registers and shared memory)."""
    kwargs.update(_pdl_kwargs(kernel, args))
    if INTERPRETING:
        COMPILES.launched(kernel.fn.__name__, specialisation(kernel, args, kwargs))
    return kernel[grid](*args, **kwargs)


def specialisation(kernel, args: tuple, kwargs: dict) -> tuple:
    """The key Triton compiles a variant for (its launcher's rules, written out)."""
    free = NOT_SPECIALISED.get(kernel.fn.__name__, frozenset())
    key = [kernel.fn.__name__]
    for name, value in zip(kernel.arg_names, args):
        key.append(_argument(value, name not in free))
    key.append(tuple(sorted((name, _constant(value)) for name, value in kwargs.items())))
    return tuple(key)


def _argument(value, specialise: bool) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("*" + str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("u1",)
    if isinstance(value, int):
        if specialise and value == 1:
            return ("constexpr", 1)
        width = "i32" if -2**31 <= value < 2**31 else "u64" if value >= 2**63 else "i64"
        return (width, specialise and value % 16 == 0)
    if isinstance(value, float):
        return ("fp32",)
    if value is None:
        return ("constexpr", None)
    return (type(value).__name__,)


def _constant(value):
    return str(value) if isinstance(value, torch.dtype) else value


def _install_compile_hook() -> None:
    """Count Triton's compiles on a GPU: its post-compile hook (triton >= 3.4's knobs, else
    the JITFunction class attribute older versions call)."""
    def counted(previous):
        def hook(*args, **kwargs):
            fn = kwargs.get("fn")  # triton's JitFunctionInfo (name: the kernel's qualname)
            COMPILES.compiled(str(getattr(fn, "name", None) or "kernel"))
            return previous(*args, **kwargs) if previous is not None else None
        return hook

    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs.runtime, "jit_post_compile_hook"):
        knobs.runtime.jit_post_compile_hook = counted(knobs.runtime.jit_post_compile_hook)
    else:  # pragma: no cover - triton < 3.4
        from triton.runtime.jit import JITFunction

        JITFunction.compiled_hook = counted(getattr(JITFunction, "compiled_hook", None))


if not INTERPRETING:
    _install_compile_hook()
