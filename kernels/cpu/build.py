"""Building and loading the native CPU kernels (native.c, native_f32.c, decode_stack.c,
int4.c, int8.c).

The C sources ship with the package and are compiled with the system's C compiler (`cc`,
or $CC) with -O3 -march=native -fopenmp into the user cache, under a name that hashes the
sources, the flags, the compiler and this CPU's flags, so that a home directory shared by
different machines never loads a binary built for another CPU. The build happens once
(about a second) and is atomic. With no compiler, not on x86-64, or KVDECK_CPU_NATIVE=0,
`library()` is None and the torch paths run. Each kernel family says whether this build has
a path for it: the bf16/fp32 kernels need AVX512-BF16 (`bf16_path()`), the INT4 and INT8
ones AVX-512 VNNI or AVX2 (`int4_isa()`). KVDECK_CPU_ISA=avx2 builds without AVX-512 (a
separate library), to run and test the AVX2 paths on a CPU that has more. The OpenMP
runtime is torch's own libgomp (already loaded, the same soname), so the kernels share
torch's thread pool and thread count. Every entry point's ctypes signature comes from
signatures.py.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from kvdeck.kernels.cpu import signatures

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent
# The kernels (bf16, their fp32 twins), and the decoder stack that composes them.
SOURCES = [_HERE / name for name in ("native.c", "native_f32.c", "decode_stack.c", "int4.c", "int8.c")]
HEADERS = [_HERE / name for name in ("native.h", "simd.h", "decode_stack.h", "decode_stack_step.h",
                                     "int4.h", "int8.h", "int_dot.h")]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-lm"]
# KVDECK_CPU_ISA: the instruction sets a build may use beyond the baseline; "avx2" leaves
# AVX-512 out (the fallback paths, testable anywhere).
ISA_FLAGS = {"native": [], "avx2": ["-mno-avx512f"]}


def available() -> bool:
    """The bf16/fp32 kernels are built (or buildable) for this CPU and not switched off."""
    return bf16_path()


def bf16_path() -> bool:
    """This build has the AVX512-BF16 kernels (native.c, native_f32.c, decode_stack.c)."""
    found = library()
    return found is not None and found.kvdeck_gemv_native() == 1


def int4_isa() -> int:
    """The integer dot product this build runs INT4 with: 2 AVX-512 VNNI, 1 AVX2, 0 none."""
    found = library()
    return 0 if found is None else found.kvdeck_q4_isa()


def flags() -> list[str]:
    isa = os.environ.get("KVDECK_CPU_ISA", "native")
    if isa not in ISA_FLAGS:
        raise ValueError(f"KVDECK_CPU_ISA must be one of {sorted(ISA_FLAGS)}, got {isa!r}")
    return FLAGS + ISA_FLAGS[isa]


def require() -> ctypes.CDLL:
    found = library()
    if found is None:
        raise RuntimeError("the native CPU kernels are not available on this machine")
    return found


@functools.cache
def library() -> ctypes.CDLL | None:
    if os.environ.get("KVDECK_CPU_NATIVE", "1") == "0":
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        loaded = ctypes.CDLL(str(built_library()))
    except subprocess.CalledProcessError as exc:
        logger.warning("building the native CPU kernels failed, bf16 runs on oneDNN alone: %s",
                       (exc.stderr or "").strip()[-500:])
        return None
    except OSError as exc:
        logger.info("native CPU kernels unavailable (%s); bf16 runs on oneDNN alone", exc)
        return None
    signatures.apply(loaded)
    return loaded


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def cache_dir() -> Path:
    override = os.environ.get("KVDECK_HOME")
    if override:
        return Path(override).expanduser() / "cache" / "kernels"
    try:
        import platformdirs
    except ImportError:  # a bare image (the GPU one has no platformdirs): its Linux default
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvdeck" / "kernels"
    return Path(platformdirs.user_cache_dir("kvdeck", appauthor=False)) / "kernels"


def built_library() -> Path:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise FileNotFoundError(f"no C compiler ({compiler!r}) on PATH")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    texts = [path.read_text() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\n".join([*texts, " ".join(flags()), version, cpu_flags()]).encode())
    target = cache_dir() / f"cpu_native-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: a concurrent process never loads a
    # half-written library, and an interrupted build leaves only a temporary file.
    fd, partial = tempfile.mkstemp(prefix=".cpu_native-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags(), *map(str, SOURCES), "-o", partial], capture_output=True,
                       text=True, check=True)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
