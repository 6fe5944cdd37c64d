"""KV cache formats (`kv_cache_dtype`) and the torch reference of their quantisation.

A format says what one cache element is and where its scale lives:
- a float type (the model's own, or a 16-bit one under an fp32 model): no scale;
- fp8 (e4m3, e5m2): one scale for a layer's K and one for its V, per tensor, as vLLM's
  default: 1.0, no calibration. Values are clamped to the format's range before the cast,
  so an outlier saturates (torch's cast would make it NaN);
- int8: one scale per (token, kv head), absmax / 127, kept in fp16 beside the cache
  (`[num_blocks, block_size, num_kv_heads]`) and written with the row. int8 has no
  exponent, so one fixed scale would either clip outliers or spend its 256 levels on a
  range few rows use; a scale per row needs no calibration, costs 2 bytes per head_dim
  bytes, and is computed where the row is written anyway.

Dequantisation is `stored * scale`. Rounding is the cache-write kernels' (fp8: round to
nearest even, as torch's cast; int8: half away from zero), so the Triton kernels are
tested bit for bit against these functions.
"""

from dataclasses import dataclass

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
INT8_MAX = 127
SCALE_DTYPE = torch.float16  # int8's per-(token, head) scales


@dataclass(frozen=True, slots=True)
class KVCacheFormat:
    name: str  # the resolved kv_cache_dtype: float32 | float16 | bfloat16 | fp8_e4m3 | fp8_e5m2 | int8
    storage: torch.dtype
    scales: str  # "none" | "tensor" (fp8) | "token_head" (int8)

    def bytes_per_token_head(self, head_dim: int) -> int:
        """Bytes one token's K (or V) of one kv head takes, scale included."""
        scale = SCALE_DTYPE.itemsize if self.scales == "token_head" else 0
        return head_dim * self.storage.itemsize + scale

    @property
    def quantized(self) -> bool:
        return self.scales != "none"


_FLOAT_FORMATS = {name: KVCacheFormat(name, dtype, "none") for name, dtype in (
    ("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16))}
_QUANT_FORMATS = {
    "fp8": KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, "tensor"),  # vLLM's fp8 is e4m3
    "fp8_e4m3": KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, "tensor"),
    "fp8_e5m2": KVCacheFormat("fp8_e5m2", torch.float8_e5m2, "tensor"),
    "int8": KVCacheFormat("int8", torch.int8, "token_head"),
}


def kv_cache_format(kv_cache_dtype: str, model_dtype: torch.dtype) -> KVCacheFormat:
    """The format a `kv_cache_dtype` name means for a model computing in `model_dtype`."""
    if kv_cache_dtype == "auto":
        return _FLOAT_FORMATS[str(model_dtype).removeprefix("torch.")]
    if kv_cache_dtype in _QUANT_FORMATS:
        return _QUANT_FORMATS[kv_cache_dtype]
    if kv_cache_dtype in _FLOAT_FORMATS:
        return _FLOAT_FORMATS[kv_cache_dtype]
    known = ["auto", *_QUANT_FORMATS, *_FLOAT_FORMATS]
    raise ValueError(f"kv_cache_dtype must be one of {known}, got {kv_cache_dtype!r}")


# ---- quantise ------------------------------------------------------------------------------

def quantize_fp8(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x / scale, saturated to the fp8 range, rounded to nearest even."""
    limit = FP8_MAX[dtype]
    return (x.float() / scale).clamp(-limit, limit).to(dtype)


def quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 over the last dim: (values, fp16 scales of shape x.shape[:-1])."""
    x = x.float()
    scales = (x.abs().amax(-1) / INT8_MAX).to(SCALE_DTYPE)
    divisor = scales.float()
    divisor = torch.where(divisor == 0, 1.0, divisor)  # an all-zero row stays zero
    y = x / divisor[..., None]
    rounded = torch.trunc(y + torch.where(y >= 0, 0.5, -0.5))  # half away from zero
    return rounded.clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scales


def dequantize(stored: torch.Tensor, scale: float | torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:
    """Cache rows back to `dtype`: `scale` is None (a float cache), a float (fp8, per tensor)
    or a tensor of stored.shape[:-1] (int8, per token and head)."""
    values = stored.to(dtype)
    if scale is None:
        return values
    if isinstance(scale, torch.Tensor):
        return values * scale.to(dtype)[..., None]
    return values * scale


def write_kv_rows(rows: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                  scale: float | torch.Tensor | None) -> None:
    """Store rows [n, num_kv_heads, head_dim] at `slots` of one cache, quantising for its
    format (and writing int8's scales into `scale`, its [num_blocks, block_size, heads])."""
    num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
    flat = cache.view(-1, num_kv_heads, head_dim)
    if cache.dtype == torch.int8:
        if not isinstance(scale, torch.Tensor):
            raise ValueError("an int8 KV cache needs its per-(token, head) scale tensor")
        values, scales = quantize_int8_rows(rows)
        flat.index_copy_(0, slots, values)
        scale.view(-1, num_kv_heads).index_copy_(0, slots, scales)
    elif cache.dtype in FP8_DTYPES:
        values = quantize_fp8(rows, cache.dtype, 1.0 if scale is None else scale)
        # index_copy has no fp8 kernel on CPU: copy the bytes.
        flat.view(torch.uint8).index_copy_(0, slots, values.view(torch.uint8))
    else:
        flat.index_copy_(0, slots, rows.to(cache.dtype))
