"""What every kernel backend shares, importing neither torch nor triton (the engine's config
reads `KERNEL_BACKENDS` in processes that never load torch).

- `KernelOps`: the set of ops a backend provides; `kernels/cpu/ops.py` builds the torch
  backend's (the references, with the native CPU kernels where they apply) and
  `kernels/triton/ops.py` Triton's. `kernels/dispatch.py` picks one per device.
- AutoAWQ's INT4 packing, which the reference, the Triton GEMM and the CPU repack all read.
- `env_switch`: a kernel choice's 0/1 environment variable (KVDECK_PDL, KVDECK_INT8_HEAD,
  KVDECK_FUSED_ACTIVATION).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

KERNEL_BACKENDS = ("auto", "triton", "torch")  # auto: Triton on CUDA, torch elsewhere

# AutoAWQ's GEMM layout packs eight 4-bit values in an int32: the value for output column
# 8*j + c sits at bits 4*i where AWQ_PACK_ORDER[i] == c.
PACK_FACTOR = 8
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# Nibble index that holds column c of a pack: the inverse permutation of AWQ_PACK_ORDER,
# which is (c >> 1) + 4 * (c & 1) (the kernels compute it that way).
AWQ_UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def env_switch(name: str, default: bool, environ: Mapping[str, str]) -> bool:
    """A 0/1 environment variable (unset or empty: `default`); any other value is an error
    naming the variable."""
    value = environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return default if not value else value == "1"


@dataclass(frozen=True, slots=True)
class KernelOps:
    """One backend's implementation of each op a model layer calls (same contracts as the
    torch references in kernels/reference/)."""

    name: str
    paged_attention: Callable
    write_kv_cache: Callable
    rms_norm: Callable
    apply_rope: Callable
    silu_and_mul: Callable
    gelu_tanh_and_mul: Callable
    # Optional: per-head q/k RMSNorm + RoPE + KV-cache write in one launch, where a backend
    # fuses them (Triton); contract `kernels.reference.qk_norm_rope_kv`. None: the model
    # calls rms_norm, apply_rope and write_kv_cache one by one.
    qk_norm_rope_kv_write: Callable | None = None
