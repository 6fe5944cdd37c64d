"""A Llama-family step of a few tokens in one native call (`decode_stack.c`).

`DecoderStack` holds one `DecoderLayerWeights` per layer (tensors of one dtype, bf16 or
fp32: the norms, the row-major projections the GEMV reads; and the layer's KV cache, of
that dtype or, under fp32, fp16: llama.cpp's default cache, half the bytes a step reads) and runs
a step of at most `max_rows` tokens through every layer without coming back to Python,
without the fifteen-odd Python calls a layer that cost a third of a SmolLM2 step (15 ms).
Built `in_passes`, it takes a step of any size as consecutive calls of `max_rows` tokens:
each pass writes its tokens' keys and values in every layer before the next pass's tokens,
which come later in their sequences, attend to them.
In bf16 it runs the same kernels in the same order as the model's forward, so the same
bits; in fp32 their fp32 twins, the forward's formulas up to the order of the sums. Every
index the step follows is checked first (a bad one is a ValueError, nothing written).
"""

import ctypes
from dataclasses import dataclass

import torch

from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.int4 import Int4Weight

# The element types the stack runs in, and its step function for each (cpu_decode_stack.c).
# (the weights' and activations' dtype, the KV cache's) -> the step function.
STEP_FUNCTIONS = {(torch.bfloat16, torch.bfloat16): "kvdeck_decode_stack_bf16",
                  (torch.float32, torch.float32): "kvdeck_decode_stack_f32",
                  (torch.float32, torch.float16): "kvdeck_decode_stack_f32_f16kv"}
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}


@dataclass(slots=True)
class DecoderLayerWeights:
    """One decoder layer, as `cpu_decode_stack.c`'s kvdeck_decoder_layer reads it (every
    tensor of the stack's dtype, the caches of theirs)."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [Q + 2 KV, H]
    qkv_bias: torch.Tensor | None  # [Q + 2 KV]
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3; with k_norm)
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor  # [H, Q]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor  # [H, I]
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    scale: float  # the attention's score scale


PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


class _Layer(ctypes.Structure):  # decode_stack.h's kvdeck_decoder_layer
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o_proj", "post_norm", "gate_up", "down",
        "k_cache", "v_cache", *(f"{name}_q4" for name in PROJECTIONS))] + [("scale", ctypes.c_float)]


class _Stack(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "block_size", "rot_dim",
        "num_blocks")] + [
        ("eps", ctypes.c_float), ("layers", ctypes.POINTER(_Layer)), ("final_norm", ctypes.c_void_p)]


class DecoderStack:
    """The layers of one model for `run`; built once the KV cache is bound (it holds the
    caches' addresses), rebuilt when the pool is."""

    def __init__(self, layers: list[DecoderLayerWeights], *, heads: int, kv_heads: int, head_dim: int,
                 rot_dim: int, eps: float, max_rows: int = cpu_native.GEMV_MAX_ROWS,
                 in_passes: bool = False, final_norm: torch.Tensor | None = None) -> None:
        library = cpu_native.require()
        if not layers:
            raise ValueError("a decoder stack needs at least one layer")
        if max_rows < 1:
            raise ValueError(f"a decoder stack takes steps of at least one row, not {max_rows}")
        hidden = layers[0].input_norm.shape[0]
        dtype, cache_dtype = layers[0].input_norm.dtype, layers[0].k_cache.dtype
        if (dtype, cache_dtype) not in STEP_FUNCTIONS:
            raise ValueError(f"a decoder stack runs in bf16 over a bf16 cache or fp32 over an fp32 or fp16 "
                             f"one, not {dtype} over {cache_dtype}")
        intermediate = layers[0].down.shape[1]
        q, kv = heads * head_dim, kv_heads * head_dim
        if head_dim > cpu_native.MAX_HEAD_DIM or heads % kv_heads or rot_dim > head_dim or rot_dim % 2:
            raise ValueError(f"a decoder stack wants kv heads dividing the heads, a head of at most "
                             f"{cpu_native.MAX_HEAD_DIM} dims and an even rotary part of it; got "
                             f"{heads} heads, {kv_heads} kv heads, head_dim {head_dim}, rot_dim {rot_dim}")
        shapes = {"input_norm": (hidden,), "qkv": (q + 2 * kv, hidden), "qkv_bias": (q + 2 * kv,),
                  "q_norm": (head_dim,), "k_norm": (head_dim,), "o_proj": (hidden, q), "post_norm": (hidden,),
                  "gate_up": (2 * intermediate, hidden), "down": (hidden, intermediate)}
        num_blocks, block_size = layers[0].k_cache.shape[:2]
        for index, layer in enumerate(layers):
            if (layer.q_norm is None) != (layer.k_norm is None):
                raise ValueError(f"layer {index}: q and k norms come together or not at all")
            for name, shape in shapes.items():
                value = getattr(layer, name)
                if isinstance(value, Int4Weight):
                    _check_int4(value, shape, f"layer {index}'s {name}")
                    continue
                _check(value, shape, dtype, f"layer {index}'s {name}", optional=name in (
                    "qkv_bias", "q_norm", "k_norm"))
            cache_shape = (num_blocks, block_size, kv_heads, head_dim)
            _check(layer.k_cache, cache_shape, cache_dtype, f"layer {index}'s k_cache")
            _check(layer.v_cache, cache_shape, cache_dtype, f"layer {index}'s v_cache")
        _check(final_norm, (hidden,), dtype, "the final norm", optional=True)
        self.layers = layers  # the tensors outlive the addresses held below
        self.final_norm = final_norm
        self.hidden = hidden
        self.dtype = dtype
        self.max_rows = max_rows
        self.in_passes = in_passes
        self._layer_array = (_Layer * len(layers))(*(_Layer(
            *(_address(getattr(layer, name)) for name, _ in _Layer._fields_[:11]),
            *(_int4_address(getattr(layer, name)) for name in PROJECTIONS), layer.scale)
            for layer in layers))
        self._stack = _Stack(len(layers), hidden, heads, kv_heads, head_dim, intermediate, block_size,
                             rot_dim, num_blocks, eps, self._layer_array, _address(final_norm))
        self._run = getattr(library, STEP_FUNCTIONS[dtype, cache_dtype])
        self._in_range = library.kvdeck_decode_stack_in_range
        size = library.kvdeck_decode_stack_workspace(ctypes.addressof(self._stack), max_rows)
        self._workspace = torch.empty(size, dtype=dtype)

    def takes(self, tokens: torch.Tensor) -> bool:
        """Whether `run` takes a step of these tokens (their ids or hidden states, one row a
        token): few enough for the GEMV (any number in passes), run eagerly (a compiled graph
        cannot trace a ctypes call)."""
        return (self.in_passes or tokens.shape[0] <= self.max_rows) and not torch.compiler.is_compiling()

    def run(self, hidden: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
            slot_mapping: torch.Tensor, block_tables: torch.Tensor,
            seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A step of a few tokens: hidden [rows, H] (their embeddings) through every layer, rows
        <= max_rows (any number `in_passes`, in token order). Each row is one token with its
        own block-table row and context length (the tokens it attends to, itself included): a
        decode step's rows as they come, a chunk's tokens through `token_contexts`. Returns (the
        last layer's output, the residual), what the final norm takes; built with a
        `final_norm`, (that norm of their sum, the sum), what the final norm returns."""
        rows = hidden.shape[0]
        most = rows if self.in_passes else self.max_rows
        if hidden.shape != (rows, self.hidden) or hidden.dtype != self.dtype or not 0 < rows <= most:
            raise ValueError(f"a decoder stack step wants {_DTYPE_NAMES[self.dtype]} hidden [rows <= "
                             f"{self.max_rows}, {self.hidden}], got {hidden.dtype} "
                             f"{tuple(hidden.shape)}")
        positions = positions.to(torch.int64).contiguous()
        slots = slot_mapping.to(torch.int64).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        if (positions.shape != (rows,) or slots.shape != (rows,) or lens.shape != (rows,)
                or tables.shape[0] != rows or cos_sin_cache.dtype != torch.float32
                or not cos_sin_cache.is_contiguous() or cos_sin_cache.shape[1] != self._stack.rot_dim):
            raise ValueError(f"a decoder stack step wants a position, a slot, a block table and a length per "
                             f"row ({rows}) and an fp32 cos|sin cache of {self._stack.rot_dim} columns")
        out = hidden.contiguous().clone()
        residual = torch.empty_like(out)
        if rows > self.max_rows and not self._in_range(
                ctypes.addressof(self._stack), rows, positions.data_ptr(), cos_sin_cache.shape[0],
                slots.data_ptr(), tables.data_ptr(), tables.stride(0), lens.data_ptr()):
            status = -2  # checked whole: no pass may write before a later one is refused
        else:
            status = self._run_passes(rows, positions, cos_sin_cache, slots, tables, lens, out, residual)
        if status == -2:
            raise ValueError(f"a decoder stack step indexes outside its tables: positions "
                             f"{positions.tolist()} (table of {cos_sin_cache.shape[0]}), slots "
                             f"{slots.tolist()}, lengths {lens.tolist()} over tables of {tables.shape[1]} "
                             f"blocks (cache of {self._stack.num_blocks})")
        if status != 0:
            raise RuntimeError("the native decoder stack refused the step")
        return out, residual


    def _run_passes(self, rows, positions, cos_sin_cache, slots, tables, lens, out, residual) -> int:
        """The step as calls of at most max_rows tokens, in order; the first non-zero status."""
        for first in range(0, rows, self.max_rows):
            status = self._run(ctypes.addressof(self._stack), min(self.max_rows, rows - first),
                               positions[first:].data_ptr(), cos_sin_cache.data_ptr(), cos_sin_cache.shape[0],
                               slots[first:].data_ptr(), tables[first:].data_ptr(), tables.stride(0),
                               lens[first:].data_ptr(), out[first:].data_ptr(), residual[first:].data_ptr(),
                               self._workspace.data_ptr())
            if status != 0:
                return status
        return 0


def token_contexts(query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                   block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence attention metadata (query_start_loc [seqs + 1], seq_lens [seqs], tables
    [seqs, width]) as `run` reads it, per token: each token's sequence's table, and its
    context, the sequence's length less the tokens after it in its chunk (causal)."""
    starts = query_start_loc.long()
    query_lens = starts[1:] - starts[:-1]
    owner = torch.repeat_interleave(torch.arange(query_lens.shape[0]), query_lens)
    after = starts[1:][owner] - 1 - torch.arange(owner.shape[0])
    return block_tables[owner], seq_lens[owner] - after


def _check(tensor: torch.Tensor | None, shape: tuple, dtype: torch.dtype, what: str,
           optional: bool = False) -> None:
    if tensor is None and optional:
        return
    if (tensor is None or tuple(tensor.shape) != shape or tensor.dtype != dtype
            or not tensor.is_contiguous() or tensor.device.type != "cpu"):
        got = "nothing" if tensor is None else f"{tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
        raise ValueError(f"{what} must be a contiguous {_DTYPE_NAMES[dtype]} CPU tensor of shape {shape}, "
                         f"got {got}")


def _check_int4(weight: Int4Weight, shape: tuple, what: str) -> None:
    if (weight.n, weight.k) != shape:
        raise ValueError(f"{what} must be INT4 tiles of [{shape[0]}, {shape[1]}], got "
                         f"[{weight.n}, {weight.k}]")


def _address(tensor: torch.Tensor | Int4Weight | None) -> int | None:
    """A dense tensor's data (an INT4 projection has none: its tiles go in its *_q4 field)."""
    return None if tensor is None or isinstance(tensor, Int4Weight) else tensor.data_ptr()


def _int4_address(weight: torch.Tensor | Int4Weight | None) -> int | None:
    return ctypes.addressof(weight.struct) if isinstance(weight, Int4Weight) else None
