"""Native CPU kernels for bf16 decode steps (`native.c`) and their fp32 twins: the wrappers.

- `bf16_gemv`: the linear layers' product for one to four rows. A decode step of a few
  rows costs the bytes of the weights it reads, and torch's kernels for one bf16 row fall
  short of the memory's speed: oneDNN's packed GEMM moves SmolLM2's weights at 16-20 GB/s
  on this 2-core EPYC, plain aten at 13, where one sequential stream per core reaches
  26-28 GB/s (llama.cpp's rate). Small weights that sit in the cache gain more: a packed
  oneDNN call costs some 20 us whatever its size. Figures: benchmarks/bench_cpu_gemv.py.
- `decode_attention`: a decode-only step's paged attention, each (row, head) one pass over
  its context with an online softmax, in fp32, where the torch path takes a dozen aten
  calls a layer and rounds its scores to bf16.
- `rms_norm`, `silu_and_mul`, `apply_rope_neox`: a bf16 layer's element-wise steps in one
  call each, rounding where the torch references round.

`native_f32.c` holds the fp32 twins of these kernels, for an fp32 model's decode steps:
the decoder stack (`decode_stack.py`) calls them, and the output head `f32_gemv`.

Built and loaded by build.py (at first use, cached per CPU); `available()` is False where
they cannot be, and the torch paths run (oneDNN's packed GEMM, the torch attention).
"""

import functools
import os
from pathlib import Path

import torch

from kvdeck.kernels.cpu.build import available, require

__all__ = ["available"]  # with the wrappers below

# Rows up to which a linear layer takes the kernel. Up to four rows it streams the weights
# near the memory's speed and beats oneDNN's packed GEMM (SmolLM2's projections 1.2-1.6x,
# the demo's 1.4-2.3x); at eight the arithmetic (one vdpbf16ps per row per 64 bytes of
# weights, plus a horizontal sum per output) is the limit and oneDNN wins (0.7x).
# Figures: benchmarks/results/cpu_gemv_smollm2.json, cpu_gemv_demo.json.
GEMV_MAX_ROWS = 4
# A bf16 model's steps of up to this many rows go through its decoder stack and its output
# head's GEMV, one pass each (kernels/cpu/decode_stack.py): a speculative verify of up to
# seven draft tokens then computes every row with a one-row decode step's very operations,
# so greedy output with speculation is plain greedy's, bit for bit, where the Python
# forward's oneDNN and SDPA would round a five-row verify differently. Past GEMV_MAX_ROWS a
# projection alone is slower than oneDNN's, but the stack saves the forward's per-layer
# Python work: SmolLM2's steps of 5 and 8 rows ran 1.29x and 1.07x faster through it
# (benchmarks/results/cpu_bf16_stack_rows.json).
BF16_STACK_MAX_ROWS = 8
# The fp32 GEMV's rows in one pass of its band (the weights read once): it beat aten's fp32
# matmul over the demo's projections at 1-32 rows (1.3x at 1, 2.1x at 4, 1.5x at 8, 1.05x at
# 32) and lost from 64 (0.94x); each pass past the first reads the weights again.
F32_GEMV_MAX_ROWS = 8
# ...and where the weights sit in the last-level cache, up to this many rows (each pass of
# eight past the first reads them again, from the cache): the demo's 4096 x 256 output head
# at 16, 32 and 64 rows took 0.70, 0.87 and 0.98 of aten's time (which copies the weight
# into its packed layout each call), its projections in the decoder stack likewise.
F32_CACHED_MAX_ROWS = 64
MAX_HEAD_DIM = 512  # native.c keeps a head's query and output in registers
# The kernel reads a row-major copy of each weight, kept beside oneDNN's packed one (which
# serves larger batches): only where the weights take at most this share of the RAM.
MAX_SHARE_OF_MEMORY = 1 / 8


def worth_a_second_copy(weight_bytes: int) -> bool:
    """Whether to keep row-major weights for the kernel beside oneDNN's packed ones."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    return weight_bytes <= memory * MAX_SHARE_OF_MEMORY and available()


def gemv_takes(x: torch.Tensor, max_rows: int = GEMV_MAX_ROWS) -> bool:
    """Whether x [..., K] has few enough rows for the GEMV to beat torch's matmul (bf16's
    oneDNN: GEMV_MAX_ROWS; fp32's aten: F32_GEMV_MAX_ROWS)."""
    return x.numel() <= max_rows * x.shape[-1]


def f32_gemv_max_rows(weight_bytes: int) -> int:
    """Rows up to which the fp32 GEMV beats aten's matmul for weights of this many bytes."""
    cache = last_level_cache_bytes()
    return F32_CACHED_MAX_ROWS if cache and weight_bytes <= cache else F32_GEMV_MAX_ROWS


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The largest CPU cache (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes, default=None)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`bf16_gemv` as a registered op under torch.compile (an opaque call in the graph)."""
    if torch.compiler.is_compiling():
        return torch.ops.kvdeck.bf16_gemv(x, weight, bias)
    return bf16_gemv(x, weight, bias)


def bf16_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] times weight [N, K] (+ bias [N]), all bf16 on CPU, at most GEMV_MAX_ROWS rows."""
    return _gemv(x, weight, bias, torch.bfloat16)


def f32_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`bf16_gemv` for fp32 (cpu_native_f32.c): fp32 sums in another order than torch's, each
    row's the same whatever the row count. An fp32 output head takes it for a step of few
    rows, where torch's fp32 matmul of one row ran the demo's head (4096 x 256) at about a
    third of a decode step."""
    return _gemv(x, weight, bias, torch.float32)


_GEMV_FUNCTIONS = {torch.bfloat16: ("bf16_gemv", "kvdeck_gemv_bf16", "bf16"),
                   torch.float32: ("f32_gemv", "kvdeck_gemv_f32", "fp32")}


def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          dtype: torch.dtype) -> torch.Tensor:
    library = require()
    name, function, dtype_name = _GEMV_FUNCTIONS[dtype]
    flat = x.reshape(-1, x.shape[-1])
    rows, k_len = flat.shape
    n_len = weight.shape[0]
    if (flat.dtype != dtype or weight.dtype != dtype or weight.shape[1] != k_len
            or not weight.is_contiguous() or flat.stride(-1) != 1 or flat.device.type != "cpu"
            or weight.device.type != "cpu"):
        raise ValueError(f"{name} wants {dtype_name} CPU tensors x [.., {weight.shape[1]}] and a contiguous "
                         f"weight, got x {tuple(x.shape)} {x.dtype}, "
                         f"weight {tuple(weight.shape)} {weight.dtype}")
    if bias is not None and (bias.dtype != dtype or bias.shape != (n_len,) or not bias.is_contiguous()):
        raise ValueError(f"{name} wants a contiguous {dtype_name} bias of shape ({n_len},)")
    out = torch.empty((rows, n_len), dtype=dtype)
    status = getattr(library, function)(flat.data_ptr(), rows, flat.stride(0), weight.data_ptr(), n_len,
                                        k_len, bias.data_ptr() if bias is not None else None, out.data_ptr(),
                                        n_len)
    if status != 0:
        raise RuntimeError("the CPU GEMV kernel refused the call")
    return out.view(*x.shape[:-1], n_len)


def decode_attention_applies(q: torch.Tensor, k_cache: torch.Tensor, max_query_len: int,
                             k_scale: object) -> bool:
    """Whether `decode_attention` can run this step: decode-only, bf16 q and cache (no
    8-bit cache's scales) on CPU, and the kernel available."""
    return (max_query_len == 1 and q.dtype == torch.bfloat16 and k_cache.dtype == torch.bfloat16
            and k_scale is None and q.device.type == "cpu" and q.shape[-1] <= MAX_HEAD_DIM
            and available())


# (q's dtype, the caches') -> the kernel.
_ATTENTION_FUNCTIONS = {(torch.bfloat16, torch.bfloat16): "kvdeck_decode_attention_bf16",
                        (torch.float32, torch.float32): "kvdeck_decode_attention_f32",
                        (torch.float32, torch.float16): "kvdeck_decode_attention_f32_f16kv"}


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     sliding_window: int = 0, soft_cap: float = 0.0) -> torch.Tensor:
    """Paged attention of one query token per row (q [rows, heads, dim]) over the caches
    [num_blocks, block_size, kv_heads, dim]: all bf16, all fp32, or fp32 q over fp16 caches
    (the decoder stack's fp32 kernels); the same contract as kernels/reference/attention.py's
    `paged_attention_torch` for a decode-only step."""
    library = require()
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    function = _ATTENTION_FUNCTIONS.get((q.dtype, k_cache.dtype))
    if function is None or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"decode_attention wants q and caches all bf16, all fp32, or fp32 q over fp16 "
                         f"caches; got q {q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}")
    if (q.stride(2) != 1 or q.stride(1) != dim or not k_cache.is_contiguous() or not v_cache.is_contiguous()
            or v_cache.shape != k_cache.shape or k_cache.shape[3] != dim or heads % kv_heads != 0):
        raise ValueError(f"decode_attention wants q [rows, heads, {dim}] with contiguous heads and "
                         f"contiguous caches [blocks, block_size, kv_heads, {dim}] whose kv heads divide "
                         f"the heads; got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    if tables.shape[0] != rows or lens.shape != (rows,):
        raise ValueError(f"decode_attention wants a block table and a length per row ({rows}), got "
                         f"{tuple(tables.shape)} and {tuple(lens.shape)}")
    out = torch.empty((rows, heads, dim), dtype=q.dtype)
    status = getattr(library, function)(
        q.data_ptr(), rows, q.stride(0), heads, dim, k_cache.data_ptr(), v_cache.data_ptr(), kv_heads,
        tables.data_ptr(), tables.stride(0), lens.data_ptr(), k_cache.shape[1], sliding_window, scale,
        soft_cap, out.data_ptr())
    if status != 0:
        raise RuntimeError("the native decode attention refused the call")
    return out


# Registered with torch.library.Library (see kernels/cpu/compiled_ops.py for why not the
# custom_op decorator).
_LIBRARY = torch.library.Library("kvdeck", "FRAGMENT")
_LIBRARY.define("bf16_gemv(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIBRARY.impl("bf16_gemv", lambda x, weight, bias: bf16_gemv(x, weight, bias), "CPU")


@torch.library.register_fake("kvdeck::bf16_gemv")
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def elementwise_applies(x: torch.Tensor) -> bool:
    """Whether the element-wise kernels (norm, activation, rotary) can take x: bf16 rows on
    CPU, run eagerly (a compiled graph fuses these steps itself; ctypes cannot be traced)."""
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.stride(-1) == 1
            and not torch.compiler.is_compiling() and available())


def rope_applies(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool) -> bool:
    """Whether `apply_rope_neox` can take this rotation: the rotate-half form on bf16 q and k
    whose heads are contiguous (views into the qkv projection are), an fp32 cache."""
    return (is_neox and elementwise_applies(q) and k.dtype == torch.bfloat16 and _heads_contiguous(q)
            and _heads_contiguous(k) and cos_sin_cache.dtype == torch.float32
            and cos_sin_cache.is_contiguous())


def _heads_contiguous(x: torch.Tensor) -> bool:  # [tokens, heads, dim], each head's dims in a row
    return x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1 or flat.dtype != torch.bfloat16 or flat.device.type != "cpu":
        raise ValueError(f"{what} wants bf16 CPU rows with contiguous last dims, got {x.dtype} "
                         f"{tuple(x.shape)} with strides {x.stride()}")
    return flat


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """kernels/reference/rmsnorm.py's `rms_norm_torch` for bf16 x and weight, in one pass per row."""
    library = require()
    flat = _rows(x, "rms_norm")
    rows, n = flat.shape
    if weight.dtype != torch.bfloat16 or weight.shape != (n,) or not weight.is_contiguous():
        raise ValueError(f"rms_norm wants a contiguous bf16 weight of shape ({n},), got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    out = torch.empty((rows, n), dtype=torch.bfloat16)
    if residual is None:
        library.kvdeck_rms_norm_bf16(flat.data_ptr(), flat.stride(0), None, 0, weight.data_ptr(), eps,
                                     rows, n, None, out.data_ptr())
        return out.view(x.shape)
    residual_rows = _rows(residual, "rms_norm's residual")
    if residual_rows.shape != flat.shape:
        raise ValueError(f"rms_norm's residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    summed = torch.empty((rows, n), dtype=torch.bfloat16)
    library.kvdeck_rms_norm_bf16(flat.data_ptr(), flat.stride(0), residual_rows.data_ptr(),
                                 residual_rows.stride(0), weight.data_ptr(), eps, rows, n, summed.data_ptr(),
                                 out.data_ptr())
    return out.view(x.shape), summed.view(x.shape)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """kernels/reference/activation.py's `silu_and_mul_torch` for bf16: x [..., 2d] -> [..., d]."""
    library = require()
    flat = _rows(x, "silu_and_mul")
    rows, width = flat.shape
    if width % 2:
        raise ValueError(f"silu_and_mul wants gate | up halves, got a last dim of {width}")
    out = torch.empty((rows, width // 2), dtype=torch.bfloat16)
    library.kvdeck_silu_and_mul_bf16(flat.data_ptr(), flat.stride(0), rows, width // 2, out.data_ptr())
    return out.view(*x.shape[:-1], width // 2)


def apply_rope_neox(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels/reference/rope.py's `apply_rope_torch` (rotate-half form) for bf16 q [tokens, heads, dim]
    and k [tokens, kv_heads, dim], whose heads may be views into one projection."""
    library = require()
    tokens, q_heads, dim = q.shape
    k_heads = k.shape[1]
    rot_dim = cos_sin_cache.shape[-1]
    if (not _heads_contiguous(q) or not _heads_contiguous(k) or k.shape[0] != tokens or k.shape[2] != dim
            or q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16
            or cos_sin_cache.dtype != torch.float32 or not cos_sin_cache.is_contiguous()
            or rot_dim > dim or rot_dim % 2 or positions.shape != (tokens,)):
        raise ValueError(f"apply_rope_neox wants bf16 q, k [tokens, heads, dim] with contiguous heads, an "
                         f"fp32 cos|sin cache of at most dim columns and a position per token; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, cache {tuple(cos_sin_cache.shape)} "
                         f"{cos_sin_cache.dtype}")
    positions = positions.to(torch.int64).contiguous()
    q_out = torch.empty((tokens, q_heads, dim), dtype=torch.bfloat16)
    k_out = torch.empty((tokens, k_heads, dim), dtype=torch.bfloat16)
    library.kvdeck_rope_neox_bf16(q.data_ptr(), q.stride(0), q_heads, k.data_ptr(), k.stride(0), k_heads,
                                  tokens, dim, positions.data_ptr(), cos_sin_cache.data_ptr(), rot_dim,
                                  q_out.data_ptr(), k_out.data_ptr())
    return q_out, k_out
