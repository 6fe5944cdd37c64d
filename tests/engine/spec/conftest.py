import shutil
from pathlib import Path

import pytest
import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def perturbed_copy(source: Path, target: Path, scale: float, seed: int = 1, sharpen: float = 1.0) -> Path:
    """The model at `source` with every weight nudged by noise of `scale` times its mean
    magnitude (a draft that agrees with it often, not always), and its output head scaled by
    `sharpen` (peakier next-token distributions); tokenizer and all."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.abs().mean())
        model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(target, safe_serialization=True)
    for path in source.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "generation")):
            shutil.copy(path, target / path.name)
    return target


@pytest.fixture(scope="session")
def tiny_draft_dirs(tmp_path_factory, tiny_model_dirs) -> dict[str, Path]:
    """Per family, a draft that accepts about half its tokens (both accepted and rejected
    drafts are exercised); same tokenizer as the target."""
    root = tmp_path_factory.mktemp("drafts")
    return {family: perturbed_copy(tiny_model_dirs[family], root / family, scale=0.03) for family in FAMILIES}


@pytest.fixture(scope="session")
def sharp_llama_dirs(tmp_path_factory, tiny_model_dirs) -> tuple[Path, Path]:
    """A tiny llama whose next-token distributions at temperature 1 are peaked enough for a
    chi-square test on a few thousand samples (its output head x3), and a draft for it."""
    root = tmp_path_factory.mktemp("sharp")
    target = perturbed_copy(tiny_model_dirs["llama"], root / "target", scale=0.0, sharpen=3.0)
    return target, perturbed_copy(target, root / "draft", scale=0.03)
