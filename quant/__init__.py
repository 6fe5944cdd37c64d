"""Weight quantisation for kvdeck: AWQ INT4 (quantise, pack, load, run), GPTQ INT4 (load,
run), bitsandbytes NF4,
and weight-only INT8 (quantised at load time; for CPU decode).

Importing this package registers the methods with the engine's registry
(`kvdeck.engine.types.quantization`); it stays light, each factory imports its torch
code when the engine builds a model.
"""

from kvdeck.engine.types.quantization import register_linear_method


def _awq_method(quant_config: dict):
    """AWQ checkpoints (AutoAWQ's GEMM layout). The optional key `w4a16_backend` (auto |
    triton | torch, not part of checkpoints) picks the INT4 GEMM."""
    from kvdeck.quant.awq_linear import AWQConfig, AWQLinearMethod

    backend = quant_config.get("w4a16_backend", "auto")
    return AWQLinearMethod(AWQConfig.from_quant_config(quant_config), backend=backend)


def _gptq_method(quant_config: dict):
    """GPTQ checkpoints (AutoGPTQ's v1 layout, 4 bits, with or without act-order), converted
    at load to AutoAWQ's layout and served by the AWQ method's kernels."""
    from kvdeck.quant.gptq_linear import GPTQConfig, GPTQLinearMethod

    return GPTQLinearMethod(GPTQConfig.from_quant_config(quant_config),
                            backend=quant_config.get("w4a16_backend", "auto"))


def _bnb_nf4_method(quant_config: dict):
    """bitsandbytes NF4, quantised from a dense checkpoint at load time."""
    from kvdeck.quant.bnb_linear import BnbNF4LinearMethod

    return BnbNF4LinearMethod()


def _int8_method(quant_config: dict):
    """Weight-only INT8 per output channel, quantised from a dense checkpoint at load time."""
    from kvdeck.quant.int8_linear import Int8LinearMethod

    return Int8LinearMethod()


register_linear_method("awq", _awq_method)
register_linear_method("gptq", _gptq_method)
register_linear_method("bnb-nf4", _bnb_nf4_method)
register_linear_method("int8", _int8_method)
