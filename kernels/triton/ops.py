"""The Triton implementation of every op, bundled for `kernels.dispatch.select_ops`.

Imported lazily by the dispatch: on CPU, TRITON_INTERPRET=1 must already be set when this
module (and so `triton.jit`) first runs, or the kernels would be built for a GPU.
"""

from kvdeck.kernels.ops import KernelOps
from kvdeck.kernels.triton.activation import gelu_tanh_and_mul_triton, silu_and_mul_triton
from kvdeck.kernels.triton.attention import paged_attention_triton
from kvdeck.kernels.triton.kv_cache import write_kv_cache_triton
from kvdeck.kernels.triton.qk_norm_rope_kv import qk_norm_rope_kv_write_triton
from kvdeck.kernels.triton.rmsnorm import rms_norm_triton
from kvdeck.kernels.triton.rope import apply_rope_triton

TRITON_OPS = KernelOps(
    name="triton",
    paged_attention=paged_attention_triton,
    write_kv_cache=write_kv_cache_triton,
    rms_norm=rms_norm_triton,
    apply_rope=apply_rope_triton,
    silu_and_mul=silu_and_mul_triton,
    gelu_tanh_and_mul=gelu_tanh_and_mul_triton,
    qk_norm_rope_kv_write=qk_norm_rope_kv_write_triton,
)
