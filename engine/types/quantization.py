"""The registry of weight-quantisation methods, by the name `quantization=` takes.

The engine builds every decoder projection with the `LinearMethod` a factory here
returns, and knows no method by name: `kvdeck.quant` registers its own (AWQ, NF4) when
`kvdeck` is imported. Light on purpose (the config validates names against it), so a
factory imports its torch code only when it is called.
"""

from collections.abc import Callable
from typing import Any

# name -> factory(quant_config) -> LinearMethod. `quant_config` is config.json's
# `quantization_config` ({} where the checkpoint has none) plus the engine's
# `w4a16_backend` choice.
LinearMethodFactory = Callable[[dict], Any]
_FACTORIES: dict[str, LinearMethodFactory] = {}


def register_linear_method(name: str, factory: LinearMethodFactory) -> None:
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"quantization method {name!r} is already registered")
    _FACTORIES[name] = factory


def linear_method_names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def make_linear_method(name: str, quant_config: dict) -> Any:
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"quantization must be one of {linear_method_names()}, got {name!r}")
    return factory(quant_config)
