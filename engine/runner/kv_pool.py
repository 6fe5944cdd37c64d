"""The KV pool's storage: its format, its layout per KV group, and which layer uses what.

A block holds `slots_per_block` layer slots (`engine/types/kv_groups.py`); storage slot j
is one K and one V tensor `[num_blocks, block_size, num_kv_heads, head_dim]` in the
format's storage type, shared by layer j of every KV group (each group reaches it through
its own block tables, so the groups never write the same block). An int8 cache also keeps
a scale per (token, head) beside each tensor (`kernels/reference/kv_quant.py`).
"""

from dataclasses import dataclass, field

import torch

from kvdeck.engine.runner.host_memory import zeros_on_huge_pages
from kvdeck.engine.runner.models.layers import PagedAttention
from kvdeck.engine.types.kv_groups import KVCacheGroup, slots_per_block
from kvdeck.kernels.reference.kv_quant import SCALE_DTYPE, KVCacheFormat, kv_cache_format

# fp8's per-tensor scale: vLLM's default without calibrated scales in the checkpoint.
FP8_TENSOR_SCALE = 1.0


def resolve_kv_format(kv_cache_dtype: str, model_dtype: torch.dtype,
                      device: torch.device) -> KVCacheFormat:
    """The cache format `kv_cache_dtype` means here, or ValueError naming what is missing."""
    fmt = kv_cache_format(kv_cache_dtype, model_dtype)
    if fmt.storage == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("kv_cache_dtype='bfloat16' needs a GPU with bfloat16 (compute capability "
                         "8.0 or newer); use float16, fp8 or int8")
    if fmt.storage.itemsize > model_dtype.itemsize:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is wider than the model's "
                         f"{str(model_dtype).removeprefix('torch.')}: it would hold the same values "
                         "in more memory; use auto")
    return fmt


@dataclass(slots=True)
class KVPool:
    format: KVCacheFormat
    groups: list[KVCacheGroup]
    block_size: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int = 0
    k: list[torch.Tensor] = field(default_factory=list)  # per storage slot
    v: list[torch.Tensor] = field(default_factory=list)
    k_scales: list[torch.Tensor] = field(default_factory=list)  # int8 only
    v_scales: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return slots_per_block(self.groups)

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block over every slot, int8's scales included."""
        per_token_head = self.format.bytes_per_token_head(self.head_dim)
        return 2 * self.num_slots * self.block_size * self.num_kv_heads * per_token_head

    def allocate(self, num_blocks: int, device: torch.device) -> None:
        shape = (num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

        def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            if device.type == "cpu":
                return zeros_on_huge_pages(shape, dtype)
            return torch.zeros(shape, dtype=dtype, device=device)

        self.k = [zeros(shape, self.format.storage) for _ in range(self.num_slots)]
        self.v = [zeros(shape, self.format.storage) for _ in range(self.num_slots)]
        if self.format.scales == "token_head":
            self.k_scales = [zeros(shape[:3], SCALE_DTYPE) for _ in range(self.num_slots)]
            self.v_scales = [zeros(shape[:3], SCALE_DTYPE) for _ in range(self.num_slots)]
        self.num_blocks = num_blocks

    def bind(self, layers: list[PagedAttention]) -> None:
        """Point each attention layer (in model order) at its group's tables and its slot."""
        for group_index, group in enumerate(self.groups):
            for slot, layer_index in enumerate(group.layers):
                layer = layers[layer_index]
                if layer.sliding_window != group.window:
                    raise RuntimeError(f"layer {layer_index} sees {layer.sliding_window} keys, its "
                                       f"KV group {group.window}")
                layer.kv_group = group_index
                layer.k_cache, layer.v_cache = self.k[slot], self.v[slot]
                scales = {}
                if self.format.scales == "tensor":
                    scales = {"k_scale": FP8_TENSOR_SCALE, "v_scale": FP8_TENSOR_SCALE}
                elif self.format.scales == "token_head":
                    scales = {"k_scale": self.k_scales[slot], "v_scale": self.v_scales[slot]}
                layer.write_options = dict(scales)
                layer.attend_options = dict(scales)
                if layer.sliding_window is not None:
                    layer.attend_options["sliding_window"] = layer.sliding_window
                if layer.soft_cap:
                    layer.attend_options["soft_cap"] = layer.soft_cap

    def release(self, layers: list[PagedAttention]) -> None:
        for layer in layers:
            layer.k_cache = layer.v_cache = torch.empty(0)
            layer.write_options, layer.attend_options = {}, {}
        self.k, self.v, self.k_scales, self.v_scales = [], [], [], []
        self.num_blocks = 0
