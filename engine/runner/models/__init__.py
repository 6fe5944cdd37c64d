"""Model families kvdeck implements, by the architecture name in config.json."""

from torch import nn

from kvdeck.engine.runner.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM
from kvdeck.engine.runner.models.llama import LlamaForCausalLM
from kvdeck.engine.runner.models.phi3 import Phi3ForCausalLM
from kvdeck.engine.runner.models.qwen2 import Qwen2ForCausalLM
from kvdeck.engine.runner.models.qwen3 import Qwen3ForCausalLM
from kvdeck.engine.types.architectures import ARCHITECTURE_FAMILIES, SUPPORTED_ARCHITECTURES

FAMILY_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "phi3": Phi3ForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    architecture: FAMILY_CLASSES[family] for architecture, family in ARCHITECTURE_FAMILIES.items()
}


def model_class_for(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"architecture {architecture!r} is not supported; kvdeck runs "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        ) from None
