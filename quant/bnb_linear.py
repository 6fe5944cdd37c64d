"""bitsandbytes NF4: a dense fp16/bf16 checkpoint quantised to 4-bit NormalFloat at load time.

The layer first holds an ordinary dense `weight` (so the usual loader and the dummy
loader fill it); `process_weights_after_loading` replaces it with the packed NF4 bytes
and bitsandbytes' quant state. On CUDA the product goes through `bnb.matmul_4bit`
(bitsandbytes' fused 4-bit GEMV for single tokens); on CPU bitsandbytes 0.50 can
quantise and dequantise, so the product is dequantise-then-matmul.
"""

import torch
from torch import nn

from kvdeck.engine.runner.models.linear import Linear, copy_shard

NF4_BLOCK_SIZE = 64


def _bnb():
    try:
        import bitsandbytes
        import bitsandbytes.functional
    except ImportError as exc:  # pragma: no cover - bitsandbytes is a dependency
        raise ValueError(
            "quantization='bnb-nf4' needs the bitsandbytes package (pip install bitsandbytes)"
        ) from exc
    return bitsandbytes


class BnbNF4LinearMethod:
    def __init__(self, blocksize: int = NF4_BLOCK_SIZE) -> None:
        _bnb()
        self.blocksize = blocksize

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(
            torch.empty(layer.output_size, layer.input_size, dtype=dtype), requires_grad=False
        )
        layer.nf4_state = None

    def load_weight(
        self, layer: Linear, param_name: str, tensor: torch.Tensor, shard_id: int | None
    ) -> None:
        if param_name != "weight":
            raise ValueError(
                f"unexpected parameter {param_name!r} for a bnb-nf4 layer: it quantises a dense "
                "checkpoint (pre-quantised bitsandbytes checkpoints are not supported)"
            )
        if layer.nf4_state is not None:
            raise ValueError("bnb-nf4 layer was already quantised; cannot load more weights")
        copy_shard(layer.weight, tensor, layer, shard_id, dim=0)

    def process_weights_after_loading(self, layer: Linear) -> None:
        if layer.nf4_state is not None:
            return
        functional = _bnb().functional
        weight = layer.weight.data
        packed, state = functional.quantize_4bit(
            weight, blocksize=self.blocksize, quant_type="nf4", compress_statistics=False
        )
        del layer.weight
        layer.nf4_weight = nn.Parameter(packed, requires_grad=False)
        layer.nf4_state = state

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.nf4_state is None:
            raise RuntimeError("bnb-nf4 layer used before process_weights_after_loading")
        bnb = _bnb()
        if x.device.type == "cuda":
            out = bnb.matmul_4bit(x, layer.nf4_weight.t(), quant_state=layer.nf4_state)
            return out if layer.bias is None else out + layer.bias
        weight = bnb.functional.dequantize_4bit(layer.nf4_weight, layer.nf4_state)
        return nn.functional.linear(x, weight.to(x.dtype), layer.bias)
