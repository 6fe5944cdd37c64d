"""The weight bytes one decode step reads: the numerator of the bandwidth roofline."""

import torch

from kvdeck.kernels.cpu.int4 import Int4Weight
from kvdeck.kernels.cpu.int8 import Int8Weight


def weight_bytes_read_per_step(model: torch.nn.Module) -> int:
    """Every parameter and buffer once, less the input embedding (a row per token) unless the
    output head reads it and less the rotary table (a row); plus INT4 layers' tiles (their
    AutoAWQ tensors are emptied once repacked) and an int8 head's tiles in place of the dense
    weight it keeps only for reference (tied: the embedding's)."""
    total, seen = 0, set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in seen or name.endswith("cos_sin_cache"):
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    embedding = model.model.embed_tokens.weight
    head = model.lm_head
    head_tiles = getattr(head, "tiles", None)
    head_weight = getattr(head, "weight", None)
    if isinstance(head_tiles, Int8Weight):
        total += head_tiles.tiles.numel() * head_tiles.tiles.element_size()
        # the dense weight is not read by the head; tied, it is the embedding, not read either
        if head_weight is not None and head_weight is not embedding:
            total -= head_weight.numel() * head_weight.element_size()
        total -= embedding.numel() * embedding.element_size()
    elif head_weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    for module in model.modules():
        tiles = getattr(module, "int4", None)
        if isinstance(tiles, Int4Weight):
            total += tiles.nbytes
    return total
