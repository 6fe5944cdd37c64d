"""Where a model's files are: a directory, a bare config.json, a hub id in the Hugging
Face cache, or (no model given) the demo model bundled as package data."""

import os
from pathlib import Path

from kvdeck.assets import demo_model_dir

DEMO_MODEL_NAME = "demo"  # as a model name: the bundled demo model


def is_demo_model(model: str | None) -> bool:
    """Whether `model` is the bundled demo model: None, "demo", or its folder."""
    if model is None or model == DEMO_MODEL_NAME:
        return True
    path = Path(os.path.expanduser(model))
    return path.is_dir() and path.resolve() == demo_model_dir().resolve()


def resolve_model_path(model: str | None) -> Path:
    """A local directory, or a hub id found in the Hugging Face cache; None or "demo": the
    bundled demo model."""
    if model is None or model == DEMO_MODEL_NAME:
        demo = demo_model_dir()
        if not (demo / "config.json").is_file():
            raise ValueError(f"no model given and the bundled demo model is missing at {demo}")
        return demo
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return path
    if path.is_file() and path.name == "config.json":
        return path.parent  # a bare config: enough for load_format='dummy'
    if path.exists():
        raise ValueError(f"model path {model!r} is a file; give the model's directory")
    if model.count("/") != 1 or model.startswith((".", "/")):
        raise ValueError(f"model {model!r} is neither a directory nor a hub id like 'org/name'")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model, local_files_only=True))
    except (LocalEntryNotFoundError, OSError):
        raise ValueError(
            f"model {model!r} is not a local directory and is not in the Hugging Face cache; "
            f"download it first with `kvdeck pull {model}`"
        ) from None
