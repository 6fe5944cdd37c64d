"""Small steps of a Llama-family model in one native call a step (kernels/cpu/decode_stack.py).

On a CPU with the native kernels, a decode step of a few rows spends much of its time
between the kernels (a third of a SmolLM2 bf16 step; most of the demo's fp32 one): the
Python calls, views and allocations of every layer.
`bind_decoder_stack` hands such a model's layers to a `DecoderStack` once its KV cache is
bound, and `LlamaModel.forward` sends it the steps it takes (decode rows or a short chunk
such as a speculative verify, eager; at most `stack_max_rows` tokens). In bf16 the stack
runs the kernels the layers would run, in their order, so decode steps give the same
tokens; in fp32 it runs their fp32 twins (cpu_native_f32.c), which
differ from torch's fp32 only in the order of their sums, as transformers' own matmuls
differ between batch shapes; the tests hold both to the Python forward's greedy tokens.
INT4 projections (AWQ layers repacked into kernels/cpu/int4.py's tiles) run inside the
stack through the same INT4 kernel the layers call, so in bf16 still the same bits.
Anything it does not cover (windows, soft caps, 8-bit caches, other quantisations, other
kernel backends, a bf16 model's second weight copy not kept) leaves the model on its
Python forward; KVDECK_CPU_NATIVE=0 leaves every model there.
"""

import logging

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Linear, UnquantizedLinearMethod
from kvdeck.engine.runner.models.llama import LlamaDecoderLayer, LlamaModel
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.cpu.decode_stack import PROJECTIONS, STEP_FUNCTIONS, DecoderLayerWeights, DecoderStack
from kvdeck.kernels.cpu.int4 import Int4Weight
from kvdeck.kernels.dispatch import TORCH_OPS

logger = logging.getLogger(__name__)

# fp32 steps of up to this many tokens take the stack where the layers' weights sit in the
# last-level cache (each pass of eight rows past the first reads them again, from the cache),
# and steps of any size take it in passes of this many. The demo model (19 MB of projections)
# at 8, 16, 32 and 64 decoding requests, per step against the per-layer path: 7.1 -> 2.3,
# 11.0 -> 5.4, 15.6 -> 9.0, 28.6 -> 23.4 ms; at 128, 52.9 -> 45.8.
FP32_CACHED_MAX_ROWS = cpu_native.F32_CACHED_MAX_ROWS
# fp32 steps of up to this many tokens take a stack whose projections are all INT4: the
# kernel reads each tile once for every row of the step (rows four at a time from the core's
# cache), so a speculative verify or a few chats cost about one row's weight bytes.
INT4_MAX_ROWS = 16


def bind_decoder_stack(model: nn.Module) -> bool:
    """Give `model` (a ...ForCausalLM) a decoder stack for its decode steps where it can
    take them, after its KV cache is bound; whether it did. Call `unbind_decoder_stack`
    before the cache is released: the stack holds the caches' addresses."""
    inner = getattr(model, "model", None)
    if not isinstance(inner, LlamaModel):
        return False
    inner.decoder_stack = None
    why = _why_not(inner)
    if why is not None:
        logger.debug("decode steps stay on the Python forward: %s", why)
        return False
    first = inner.layers[0]
    attention = first.self_attn
    layers = [_layer_weights(layer) for layer in inner.layers]
    try:
        inner.decoder_stack = DecoderStack(
            layers, heads=attention.num_heads, kv_heads=attention.num_kv_heads, head_dim=attention.head_dim,
            rot_dim=inner.rotary.cos_sin_cache.shape[1], eps=first.input_layernorm.eps,
            max_rows=stack_max_rows(layers), in_passes=stack_in_passes(layers), final_norm=inner.norm.weight)
    except ValueError as exc:
        logger.info("decode steps stay on the Python forward: %s", exc)
        return False
    return True


def unbind_decoder_stack(model: nn.Module) -> None:
    inner = getattr(model, "model", None)
    if isinstance(inner, LlamaModel):
        inner.decoder_stack = None


def stack_max_rows(layers: list[DecoderLayerWeights]) -> int:
    """The most tokens a step through these layers may have. bf16: BF16_STACK_MAX_ROWS (a
    speculative verify's rows get a one-row step's bits; a prompt chunk keeps the Python
    forward's oneDNN and SDPA). fp32: INT4_MAX_ROWS where every projection is INT4; else
    F32_GEMV_MAX_ROWS in one pass of its GEMV, and up to FP32_CACHED_MAX_ROWS where the
    projections' weights fit in the last-level cache (the demo's 19 MB in this CPU's 32)."""
    first = layers[0]
    if first.input_norm.dtype != torch.float32:
        return cpu_native.BF16_STACK_MAX_ROWS
    projections = [getattr(layer, name) for layer in layers for name in PROJECTIONS]
    if all(isinstance(weight, Int4Weight) for weight in projections):
        return INT4_MAX_ROWS
    weight_bytes = sum(weight.numel() * weight.element_size() for weight in projections)
    return cpu_native.f32_gemv_max_rows(weight_bytes)


def stack_in_passes(layers: list[DecoderLayerWeights]) -> bool:
    """Whether steps of any size (prefill chunks, mixed steps) take the stack, in passes of
    `stack_max_rows` tokens: in fp32 where the projections fit in the last-level cache, so
    each pass reads them from the cache, not from memory."""
    return stack_max_rows(layers) == FP32_CACHED_MAX_ROWS


def decoder_stack_takes(model: nn.Module, input_ids: torch.Tensor) -> bool:
    """Whether `model`'s decoder stack takes this step. Where it does it beats a compiled
    CPU graph (SmolLM2 bf16 at batch 1: about 11 ms against 19; the demo in fp32: 1.2
    against 4.8), so the runner runs the eager forward, which sends the step to the stack."""
    inner = getattr(model, "model", None)
    return isinstance(inner, LlamaModel) and inner.decoder_stack is not None and (
        inner.decoder_stack.takes(input_ids))


def why_no_decoder_stack(model: nn.Module) -> str | None:
    """Why a Llama-family CPU model's decode steps run the Python forward instead of the
    native decoder stack (None: they take it, or the model is not of that family)."""
    inner = getattr(model, "model", None)
    if not isinstance(inner, LlamaModel) or inner.decoder_stack is not None:
        return None
    return _why_not(inner) or "the stack could not be built"


def decoder_stack_rows(model: nn.Module) -> int | None:
    """The most rows a step may have and still take `model`'s decoder stack (None: no stack,
    or one that takes steps of any size in passes)."""
    inner = getattr(model, "model", None)
    stack = inner.decoder_stack if isinstance(inner, LlamaModel) else None
    return None if stack is None or stack.in_passes else stack.max_rows


def _why_not(model: LlamaModel) -> str | None:
    """Why the stack cannot run this model's decode steps, or None when it can (the build
    of the native kernels is asked about last: only a bf16 or fp32 CPU model gets that far)."""
    norms = {model.norm.eps}
    dtype = model.embed_tokens.weight.dtype
    for index, layer in enumerate(model.layers):
        if not isinstance(layer, LlamaDecoderLayer):
            return f"layer {index} is not a Llama decoder layer"
        attention, paged = layer.self_attn, layer.self_attn.attn
        if attention.ops is not TORCH_OPS:
            return f"the {attention.ops.name} kernel backend"
        if (paged.sliding_window is not None or paged.soft_cap is not None or paged.write_options
                or paged.attend_options or paged.kv_group != 0):
            return f"layer {index}'s attention has a window, a cap, an 8-bit cache or a second KV group"
        if (dtype, paged.k_cache.dtype) not in STEP_FUNCTIONS or paged.k_cache.device.type != "cpu":
            return "the model and its KV cache are not bf16 over bf16, fp32 over fp32 or fp16, on the CPU"
        linears = (attention.qkv_proj, attention.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        if any(_projection_weight(linear, dtype) is None for linear in linears):
            return ("a projection has neither a row-major weight nor INT4 tiles (another quantisation, or "
                    "bf16 too large for a second copy)")
        if any(linear.bias is not None for linear in linears[1:]):
            return f"layer {index} has a bias beyond q/k/v"
        norms |= {layer.input_layernorm.eps, layer.post_attention_layernorm.eps}
        if attention.q_norm is not None:
            norms |= {attention.q_norm.eps, attention.k_norm.eps}
    if len(norms) != 1:
        return "the norms differ in eps"
    if not cpu_native.available():
        return "the native CPU kernels are not available"
    return None


def _projection_weight(linear: Linear, dtype: torch.dtype) -> torch.Tensor | Int4Weight | None:
    """What the stack reads for a projection: its INT4 tiles, or the [out, in] weight its GEMV
    reads (a bf16 layer's kept copy beside oneDNN's packed one, an fp32 layer's own weight);
    None for anything else (another quantisation, say)."""
    if getattr(linear, "input_permutation", None) is not None:
        return None  # GPTQ's act-order: the layer gathers its input first, the stack does not
    int4 = getattr(linear, "int4", None)
    if isinstance(int4, Int4Weight):
        return int4
    if linear.dense_weight is not None:
        return linear.dense_weight
    weight = getattr(linear, "weight", None)
    if (isinstance(linear.method, UnquantizedLinearMethod) and linear.packed_number is None
            and isinstance(weight, torch.Tensor) and weight.dtype == dtype == torch.float32):
        return weight.data
    return None


def _layer_weights(layer: LlamaDecoderLayer) -> DecoderLayerWeights:
    attention, paged = layer.self_attn, layer.self_attn.attn
    dtype = layer.input_layernorm.weight.dtype
    return DecoderLayerWeights(
        input_norm=layer.input_layernorm.weight.data, qkv=_projection_weight(attention.qkv_proj, dtype),
        qkv_bias=None if attention.qkv_proj.bias is None else attention.qkv_proj.bias.data,
        q_norm=None if attention.q_norm is None else attention.q_norm.weight.data,
        k_norm=None if attention.k_norm is None else attention.k_norm.weight.data,
        o_proj=_projection_weight(attention.o_proj, dtype),
        post_norm=layer.post_attention_layernorm.weight.data,
        gate_up=_projection_weight(layer.mlp.gate_up_proj, dtype),
        down=_projection_weight(layer.mlp.down_proj, dtype),
        k_cache=paged.k_cache, v_cache=paged.v_cache, scale=paged.scale)
