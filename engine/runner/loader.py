"""Load a model's weights into kvdeck's modules.

Weights come from safetensors only; pickle checkpoints (.bin/.pt) are refused unless
`allow_pickle` is set, since unpickling runs arbitrary code.
"""

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from kvdeck.engine.runner.models.linear import Linear

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def checkpoint_files(model_dir: Path, allow_pickle: bool) -> tuple[list[Path], bool]:
    """The weight files, and whether they are safetensors."""
    safetensors_files = sorted(model_dir.glob("*.safetensors"))
    if safetensors_files:
        return safetensors_files, True
    pickle_files = sorted(model_dir.glob("*.bin")) + sorted(model_dir.glob("*.pt"))
    if pickle_files and not allow_pickle:
        raise ValueError(
            f"{model_dir} has only pickle checkpoints ({pickle_files[0].name}); loading them can run "
            "arbitrary code, so kvdeck refuses unless you pass allow_pickle=True (--allow-pickle)"
        )
    if not pickle_files:
        raise ValueError(f"{model_dir} has no weight files (*.safetensors)")
    return pickle_files, False


def iterate_checkpoint(files: list[Path], is_safetensors: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        if is_safetensors:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            yield from state.items()


def load_weights(model: nn.Module, model_dir: Path, allow_pickle: bool = False) -> None:
    """Copy every checkpoint tensor into its module; fail if any parameter is left unset."""
    files, is_safetensors = checkpoint_files(model_dir, allow_pickle)
    packed: dict[str, tuple[str, int]] = getattr(model, "packed_modules", {})
    tied = model.config.tie_word_embeddings
    expected = {name for name, _ in _named_tensors(model)}
    if tied:
        expected.discard("lm_head.weight")
    loaded: set[str] = set()
    for name, tensor in iterate_checkpoint(files, is_safetensors):
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        module_path, _, param_name = name.rpartition(".")
        parent, _, leaf = module_path.rpartition(".")
        shard_id = None
        if leaf in packed:
            leaf, shard_id = packed[leaf]
            module_path = f"{parent}.{leaf}" if parent else leaf
        try:
            module = model.get_submodule(module_path)
        except AttributeError:
            raise ValueError(f"checkpoint tensor {name!r} matches no module of the model") from None
        if isinstance(module, Linear):
            module.load_weight(param_name, tensor, shard_id)
        else:
            target = getattr(module, param_name, None)
            if not isinstance(target, torch.Tensor):
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(target.shape)}"
                )
            target.data.copy_(tensor.to(target.dtype))
        loaded.add(f"{module_path}.{param_name}")
    missing = sorted(expected - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"the checkpoint in {model_dir} lacks {len(missing)} weights: {shown}")
    finish_loading(model)


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights for benchmarks (load_format='dummy'): small floats, ints in range."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _, tensor in _named_tensors(model):
        if tensor.dtype.is_floating_point:
            values = torch.empty(tensor.shape, dtype=torch.float32).uniform_(
                -0.02, 0.02, generator=generator
            )
        else:
            info = torch.iinfo(tensor.dtype)
            values = torch.randint(info.min, info.max, tensor.shape, generator=generator,
                                   dtype=torch.int64)
        tensor.data.copy_(values.to(tensor.dtype))
    for module in model.modules():
        if hasattr(module, "weight") and module.__class__.__name__ == "RMSNorm":
            module.weight.data.fill_(1.0)
    finish_loading(model)


def finish_loading(model: nn.Module) -> None:
    """Let layers derive what they compute with from what they loaded (AWQ repacking,
    Gemma's 1 + weight)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.method.process_weights_after_loading(module)
        elif hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()


def _named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters and persistent buffers, each shared tensor once."""
    yield from model.named_parameters()
    non_persistent = set()
    for module_name, module in model.named_modules():
        for buffer_name in getattr(module, "_non_persistent_buffers_set", ()):
            non_persistent.add(f"{module_name}.{buffer_name}" if module_name else buffer_name)
    for name, buffer in model.named_buffers():
        if name not in non_persistent:
            yield name, buffer
