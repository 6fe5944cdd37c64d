"""AWQ over a Hugging Face causal LM, one decoder layer at a time.

Only the embeddings (to catch layer 0's inputs) and the layer being quantised sit on the
compute device, so a 7B model in fp16 needs about one layer of GPU memory plus the
calibration activations. For each layer: record the inputs of its linears on the
calibration batch (its fp outputs become the next layer's inputs, as in AutoAWQ), search
and fold the scales of the four groups (norm -> q/k/v, v -> o when shapes allow,
norm -> gate/up, up -> down), search clipping, then quantise and pack. The model is
left holding the dequantised INT4 weights (what the checkpoint computes), so it can be
evaluated directly afterwards.
"""

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kvdeck.kernels.cpu.linear import bf16_packing_supported
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq
from kvdeck.quant.awq_search import (
    apply_clip,
    channel_means,
    fold_scales_into_linear,
    fold_scales_into_norm,
    search_clip,
    search_scale,
)
from kvdeck.quant.packing import pack_awq_weight

# Families whose decoder layers have Llama's shape (RMSNorm, q/k/v/o, gate/up/down).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
LINEAR_NAMES = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)
# Linears whose input is recorded; the others read the same tensor.
INPUT_OF = {
    "self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.q_proj",
    "self_attn.v_proj": "self_attn.q_proj", "self_attn.o_proj": "self_attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.gate_proj",
    "mlp.down_proj": "mlp.down_proj",
}
# q/k feed a dot product with each other: clipping them is scored badly by a linear error.
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")


@dataclass(frozen=True, slots=True)
class AWQSettings:
    group_size: int = 128
    n_grid: int = 20
    duo_scaling: bool = True
    clip: bool = True
    batch_size: int = 8  # calibration samples per forward (bounds activation memory)
    # The scale search scores its grid on this many calibration sequences (spread over the set;
    # the per-channel statistics it starts from use every one): a grid point is a block
    # forward, 20 of them per search, and on a CPU scoring all 128 sequences took half an hour
    # for a 135M model. benchmarks/results/quality_smollm2_cpu.json: the same perplexity.
    search_samples: int = 16
    # ...and in bf16 where the layer is fp32 on a CPU that does bf16 matmuls natively (twice
    # fp32's speed); the folds and the quantisation stay in the layer's own dtype.
    search_in_bf16: bool = True


@dataclass(frozen=True, slots=True)
class QuantizeProgress:
    layer: int  # layers finished
    num_layers: int
    elapsed_s: float
    eta_s: float

    def fraction(self) -> float:
        return self.layer / self.num_layers


ProgressCallback = Callable[[QuantizeProgress], None]


@dataclass(frozen=True, slots=True)
class QuantizeStep:
    """Progress inside the layers, a few seconds apart at most: which step runs now and how
    much of all layers' work is done (by block forwards over the calibration batch)."""

    fraction: float
    what: str  # e.g. "layer 3/6: scale search, mlp (12/20)"
    elapsed_s: float


StepCallback = Callable[[QuantizeStep], None]
STEP_REPORT_S = 0.5  # at most this often (every grid point on a fast GPU would be noise)


class _StepReporter:
    """Counts a layer's work in block forwards: recording the inputs (1), each scale search
    (n_grid), each clip search (1), and reports the fraction done."""

    def __init__(self, on_step: StepCallback | None, num_layers: int, scale_searches: int,
                 settings: AWQSettings, start: float) -> None:
        self.on_step = on_step
        self.num_layers = num_layers
        self.n_grid = settings.n_grid
        clips = sum(settings.clip and name not in NO_CLIP for name in LINEAR_NAMES)
        self.per_layer = 1 + scale_searches * settings.n_grid + clips
        self.start = start
        self.layer = 0
        self.done = 0  # units of the current layer
        self.partial = 0.0  # of the unit under way, by calibration batches
        self.current = ""  # what the unit under way is
        self.last = 0.0

    def begin_layer(self, index: int) -> None:
        self.layer, self.done, self.partial = index, 0, 0.0
        self.current = "recording the linears' inputs"
        self.report(self.current, force=True)

    def advance(self, what: str) -> None:
        self.done += 1
        self.partial = 0.0
        self.current = what
        self.report(what)

    def chunk(self, index: int, count: int) -> None:
        """One calibration batch of a block forward done: a report within the unit."""
        self.partial = index / count
        self.report(f"{self.current}, batch {index}/{count}")

    def report(self, what: str, force: bool = False, in_layer: bool = True) -> None:
        now = time.monotonic()
        if self.on_step is None or (not force and now - self.last < STEP_REPORT_S):
            return
        self.last = now
        done = min(self.done + self.partial, self.per_layer)
        fraction = (self.layer + done / self.per_layer) / self.num_layers
        if in_layer:
            what = f"layer {self.layer + 1}/{self.num_layers}: {what}"
        self.on_step(QuantizeStep(fraction, what, now - self.start))

    def search(self, what: str) -> Callable[[int], None]:
        """The on_grid_point callback of one scale search (made as the search starts)."""
        self.current = f"scale search, {what} (reference)"

        def grid_point(point: int) -> None:
            self.advance(f"scale search, {what} ({point}/{self.n_grid})")

        return grid_point


def check_supported(config) -> None:
    """Refuse, before any work, models whose shape AWQ-in-kvdeck cannot handle."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture {model_type!r} for AWQ quantisation; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )


GROUP_SIZES = (128, 64, 32)  # AutoAWQ's


def _input_widths(config) -> dict[str, int]:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
            "num_attention_heads * head_dim": config.num_attention_heads * head_dim}


def default_group_size(config) -> int:
    """The largest of AutoAWQ's group sizes that divides every quantised layer's input width
    (SmolLM2's hidden size 576 takes 64)."""
    for size in GROUP_SIZES:
        if all(width % size == 0 for width in _input_widths(config).values()):
            return size
    widths = ", ".join(f"{name} = {width}" for name, width in _input_widths(config).items())
    raise ValueError(f"no AWQ group size in {GROUP_SIZES} divides every input width ({widths})")


def check_group_divisibility(config, group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"the AWQ group size must be one of {GROUP_SIZES}, got {group_size}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for name, size in _input_widths(config).items():
        if size % group_size != 0:
            raise ValueError(
                f"{name} = {size} is not divisible by the AWQ group size {group_size}"
            )
    outputs = {
        "num_key_value_heads * head_dim": config.num_key_value_heads * head_dim,
        "intermediate_size": config.intermediate_size,
    }
    for name, size in outputs.items():
        if size % 8 != 0:
            raise ValueError(f"{name} = {size} is not a multiple of 8 (int4 packing)")


@torch.no_grad()
def quantize_rtn(model: nn.Module, group_size: int) -> dict[str, torch.Tensor]:
    """Round-to-nearest INT4 (the baseline AWQ is measured against): every decoder-layer
    linear quantised per group as it is, no calibration, no scales, no clipping; the same
    packed layout as quantize_awq."""
    check_supported(model.config)
    check_group_divisibility(model.config, group_size)
    packed: dict[str, torch.Tensor] = {}
    for index, layer in enumerate(model.model.layers):
        for name in LINEAR_NAMES:
            qweight, qzeros, scales = pack_awq_weight(layer.get_submodule(name).weight.data, group_size)
            prefix = f"model.layers.{index}.{name}"
            packed.update({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros,
                           f"{prefix}.scales": scales})
    return packed


class _StopForward(Exception):
    pass


@torch.no_grad()
def quantize_awq(
    model: nn.Module,
    calibration_ids: torch.Tensor,
    settings: AWQSettings = AWQSettings(),
    device: torch.device | str = "cpu",
    progress: ProgressCallback | None = None,
    on_step: StepCallback | None = None,
) -> dict[str, torch.Tensor]:
    """Quantise every decoder-layer linear of `model` (on CPU; moved to `device` a layer at a
    time). Returns the packed tensors {"model.layers.i.<linear>.qweight": ..., "...qzeros",
    "...scales"} in AutoAWQ's GEMM layout; norms and biases are updated in the model.
    `progress` hears of each finished layer, `on_step` of the work inside them."""
    check_supported(model.config)
    check_group_divisibility(model.config, settings.group_size)
    if calibration_ids.dim() != 2 or calibration_ids.numel() == 0:
        raise ValueError("calibration_ids must be a non-empty [num_samples, seq_len] tensor")
    device = torch.device(device)
    layers = model.model.layers
    start = time.monotonic()
    attn = layers[0].self_attn
    steps = _StepReporter(on_step, len(layers),
                          4 if attn.v_proj.weight.shape == attn.o_proj.weight.shape else 3,
                          settings, start)

    def captured(batch: int, batches: int) -> None:
        steps.report(f"capturing layer 1's inputs (batch {batch}/{batches})", force=batch == 1,
                     in_layer=False)

    hidden, layer_kwargs = _catch_layer0_inputs(model, calibration_ids, settings.batch_size, device,
                                                captured)
    packed: dict[str, torch.Tensor] = {}
    start = time.monotonic()
    for index, layer in enumerate(layers):
        layer.to(device)
        steps.begin_layer(index)
        inputs, next_hidden = _record_linear_inputs(layer, hidden, layer_kwargs,
                                                    settings.batch_size, steps.chunk)
        steps.advance("searching the scales")
        _search_and_fold_scales(layer, inputs, layer_kwargs, settings, steps)
        for name in LINEAR_NAMES:
            linear = layer.get_submodule(name)
            if settings.clip and name not in NO_CLIP:
                max_val = search_clip(linear.weight, inputs[INPUT_OF[name]], settings.group_size)
                apply_clip(linear, max_val, settings.group_size)
                steps.advance(f"clip search, {name}")
            qweight, qzeros, scales = pack_awq_weight(linear.weight.data, settings.group_size)
            prefix = f"model.layers.{index}.{name}"
            packed[f"{prefix}.qweight"] = qweight.cpu()
            packed[f"{prefix}.qzeros"] = qzeros.cpu()
            packed[f"{prefix}.scales"] = scales.cpu()
            dense = dequantize_awq(qweight, qzeros, scales.float(), settings.group_size)
            linear.weight.data = dense.t().to(linear.weight.dtype).contiguous()
        layer.to("cpu")
        del inputs
        hidden = next_hidden
        if progress is not None:
            elapsed = time.monotonic() - start
            done = index + 1
            progress(QuantizeProgress(done, len(layers), elapsed,
                                      elapsed / done * (len(layers) - done)))
    return packed


def _catch_layer0_inputs(
    model: nn.Module, ids: torch.Tensor, batch_size: int, device: torch.device,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[list[torch.Tensor], dict]:
    """Run the model up to layer 0 and keep what it receives (hidden states and kwargs)."""
    inner = model.model
    inner.embed_tokens.to(device)
    if getattr(inner, "rotary_emb", None) is not None:
        inner.rotary_emb.to(device)
    caught: list[torch.Tensor] = []
    kwargs_seen: dict = {}

    def hook(module, args, kwargs):
        caught.append(args[0] if args else kwargs["hidden_states"])
        if not kwargs_seen:
            kwargs_seen.update(kwargs)
        raise _StopForward

    handle = inner.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        batches = -(-ids.shape[0] // batch_size)
        for start in range(0, ids.shape[0], batch_size):
            if on_batch is not None:
                on_batch(start // batch_size + 1, batches)
            try:
                model(ids[start:start + batch_size].to(device), use_cache=False)
            except _StopForward:
                pass
    finally:
        handle.remove()
        inner.embed_tokens.to("cpu")
    kwargs_seen.pop("hidden_states", None)
    kwargs_seen["use_cache"] = False
    # No cache: transformers names it `cache` since 5.2x, `past_key_values` before (giving
    # both warns); the layer's own call says which.
    kwargs_seen["cache" if "cache" in kwargs_seen else "past_key_values"] = None
    # No padding in calibration: every sample has the same mask, positions and rotary
    # tables; keep one row so they broadcast over batches of any size.
    batch = caught[0].shape[0]
    return caught, {key: _first_row(value, batch) for key, value in kwargs_seen.items()}


def _first_row(value, batch: int):
    if isinstance(value, tuple):
        return tuple(_first_row(item, batch) for item in value)
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == batch:
        return value[:1]
    return value


def _layer_output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _record_linear_inputs(
    layer: nn.Module, hidden: list[torch.Tensor], kwargs: dict, batch_size: int,
    on_chunk: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    recorded: dict[str, list[torch.Tensor]] = {name: [] for name in set(INPUT_OF.values())}
    handles = [
        layer.get_submodule(name).register_forward_hook(
            lambda module, args, output, name=name: recorded[name].append(args[0])
        )
        for name in recorded
    ]
    outputs = []
    try:
        for index, chunk in enumerate(hidden):
            outputs.append(_layer_output(layer(chunk, **kwargs)))
            if on_chunk is not None:
                on_chunk(index + 1, len(hidden))
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(chunks, dim=0) for name, chunks in recorded.items()}, outputs


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], batch_size: int,
             on_chunk: Callable[[int, int], None] | None = None):
    def run(x: torch.Tensor) -> torch.Tensor:
        starts = range(0, x.shape[0], batch_size)
        outputs = []
        for index, i in enumerate(starts):
            outputs.append(fn(x[i:i + batch_size]))
            if on_chunk is not None:
                on_chunk(index + 1, len(starts))
        return torch.cat(outputs)

    return run


def _search_and_fold_scales(
    layer: nn.Module, inputs: dict[str, torch.Tensor], kwargs: dict, settings: AWQSettings,
    steps: _StepReporter,
) -> None:
    attn, mlp = layer.self_attn, layer.mlp
    attn_kwargs = {k: v for k, v in kwargs.items() if k != "use_cache"}
    batch, group, grid = settings.batch_size, settings.group_size, settings.n_grid

    # The searches run on a copy (in bf16 where that is faster), scoring the layer as it came
    # in; the folds are applied to the layer itself afterwards.
    scored = _search_copy(layer, settings)
    dtype = next(scored.parameters()).dtype
    s_attn, s_mlp = scored.self_attn, scored.mlp

    scored_kwargs = {key: _cast_floats(value, dtype) for key, value in attn_kwargs.items()}

    def attention(x: torch.Tensor) -> torch.Tensor:
        return _layer_output(s_attn(hidden_states=x, **scored_kwargs))

    tick = steps.chunk  # progress reports per calibration batch of each block forward

    def search(block, linears, name, what):
        x = inputs[name]
        every = max(1, x.shape[0] // settings.search_samples)
        sample = x[::every][:settings.search_samples].to(dtype)
        return search_scale(_chunked(block, batch, tick), linears, sample, group, grid, settings.duo_scaling,
                            steps.search(what), x_mean=channel_means(x))

    qkv_scales = search(attention, [s_attn.q_proj, s_attn.k_proj, s_attn.v_proj], "self_attn.q_proj", "q/k/v")
    v_o_scales = None
    if attn.v_proj.weight.shape == attn.o_proj.weight.shape:
        # With grouped-query attention v's rows do not map one to one onto o's inputs.
        v_o_scales = search(s_attn.o_proj, [s_attn.o_proj], "self_attn.o_proj", "v→o")
    mlp_scales = search(s_mlp, [s_mlp.gate_proj, s_mlp.up_proj], "mlp.gate_proj", "gate/up")
    down_scales = search(s_mlp.down_proj, [s_mlp.down_proj], "mlp.down_proj", "down")
    del scored
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [mlp.gate_proj, mlp.up_proj]

    # The recorded inputs are divided too: the clip search then sees what the scaled
    # weights will really be multiplied with.
    fold_scales_into_norm(layer.input_layernorm, qkv, qkv_scales)
    _divide(inputs, "self_attn.q_proj", qkv_scales)
    if v_o_scales is not None:
        fold_scales_into_linear(attn.v_proj, [attn.o_proj], v_o_scales)
        _divide(inputs, "self_attn.o_proj", v_o_scales)
    fold_scales_into_norm(layer.post_attention_layernorm, gate_up, mlp_scales)
    _divide(inputs, "mlp.gate_proj", mlp_scales)
    fold_scales_into_linear(mlp.up_proj, [mlp.down_proj], down_scales)
    _divide(inputs, "mlp.down_proj", down_scales)


def _search_copy(layer: nn.Module, settings: AWQSettings) -> nn.Module:
    """The layer the scale searches score: a copy, in bf16 where the layer is fp32 on a CPU
    that computes bf16 natively."""
    scored = copy.deepcopy(layer)
    parameter = next(layer.parameters())
    if (settings.search_in_bf16 and parameter.dtype == torch.float32 and parameter.device.type == "cpu"
            and bf16_packing_supported()):
        scored = scored.to(torch.bfloat16)
    return scored


def _cast_floats(value, dtype: torch.dtype):
    """The rotary tables (and any float mask) in the searched copy's dtype."""
    if isinstance(value, tuple):
        return tuple(_cast_floats(item, dtype) for item in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def _divide(inputs: dict[str, torch.Tensor], name: str, scales: torch.Tensor) -> None:
    inputs[name] = inputs[name] / scales.to(inputs[name].dtype)
