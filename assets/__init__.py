"""Files kvdeck ships with: the demo model and the calibration text (package data, found
through importlib.resources, so an installed wheel has them as a checkout does). How they
were made: scripts/train_demo_model.py and scripts/train_demo_draft.py (the demo model and
its draft), calibration/build_calibration.py (the calibration text); those run as scripts,
not as part of the package."""

from importlib.resources import files
from pathlib import Path


def asset_path(*parts: str) -> Path:
    return Path(str(files(__name__).joinpath(*parts)))


def demo_model_dir() -> Path:
    """The bundled demo model (5.8M parameters; its card is demo_model/MODEL_CARD.md)."""
    return asset_path("demo_model")


def demo_draft_dir() -> Path:
    """The demo model's draft for speculative decoding (its card is demo_draft/MODEL_CARD.md)."""
    return asset_path("demo_draft")


def calibration_text() -> Path:
    """The AWQ calibration text (Python docstrings, PSF licence; see calibration/README.md)."""
    return asset_path("calibration", "calibration.txt")
