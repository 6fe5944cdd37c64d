"""The chat's LoRA adapter choice: the adapter folders beside the models (app/store/
adapter_folders.py) that fit the loaded model, offered when the engine runs with LoRA on,
and the LoRARequest a chat message runs under (one id per folder for the whole session, so
the engine keeps one copy of each and its cached prefixes stay the adapter's)."""

from __future__ import annotations

from pathlib import Path

from kvdeck.engine.types.lora import LoRARequest

_IDS: dict[str, int] = {}  # adapter folder -> its id in this process


def lora_enabled(client: object) -> bool:
    """Whether `client` is a local engine started with enable_lora (an attached server's
    client has no config: its adapters are its own models)."""
    return bool(getattr(getattr(client, "config", None), "enable_lora", False))


def adapter_choices(client: object) -> list[tuple[str, str]] | None:
    """(label, folder) of the usable adapters for the loaded model, or None when the engine
    runs without LoRA. An adapter trained on another listed model is left out; one whose base
    is not listed here is offered (the engine checks its shapes when it is used)."""
    if not lora_enabled(client):
        return None
    from kvdeck.app.store import local_models  # reads the store: only when the choice is shown
    from kvdeck.app.store.adapter_folders import find_adapters

    models = local_models.list_models(bundled=True)
    model_dir = getattr(client, "model_dir", None)
    loaded = {m.name for m in models
              if model_dir is not None and m.path.resolve() == Path(model_dir).resolve()}
    return [(f"{a.name} (LoRA, rank {a.rank})", str(a.path)) for a in find_adapters(models)
            if a.usable and (a.base_model is None or not loaded or a.base_model in loaded)]


def lora_request_for(adapter_dir: str) -> LoRARequest:
    """The LoRARequest for an adapter folder: named by the folder, the same id every time."""
    key = str(Path(adapter_dir).expanduser().resolve())
    lora_id = _IDS.setdefault(key, len(_IDS) + 1)
    return LoRARequest(Path(key).name, lora_id, key)
