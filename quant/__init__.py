"""Weight quantisation for kvdeck: AWQ INT4 (quantise, pack, load, run) and bitsandbytes NF4.

`get_linear_method` is what `engine.models.linear.get_linear_method` calls for a
non-None `quantization`.
"""

QUANTIZATION_METHODS = ("awq", "bnb-nf4")


def get_linear_method(quantization: str, quant_config: dict):
    """The LinearMethod for every decoder-layer projection of a quantised model.

    `quant_config` is config.json's `quantization_config` for AWQ ({} for bnb-nf4). The
    optional key `w4a16_backend` (auto | triton | torch, not part of checkpoints) picks the
    INT4 GEMM: auto = Triton on CUDA for small batches, dequantise-then-matmul otherwise.
    """
    if quantization == "awq":
        from quant.awq_linear import AWQConfig, AWQLinearMethod

        backend = quant_config.get("w4a16_backend", "auto")
        return AWQLinearMethod(AWQConfig.from_quant_config(quant_config), backend=backend)
    if quantization == "bnb-nf4":
        from quant.bnb_linear import BnbNF4LinearMethod

        return BnbNF4LinearMethod()
    raise ValueError(
        f"quantization must be one of {QUANTIZATION_METHODS}, got {quantization!r}"
    )


__all__ = ["QUANTIZATION_METHODS", "get_linear_method"]
