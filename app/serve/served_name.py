"""The names the server answers to: a short served name (what /v1/models lists and every
response carries) and the other names a request may give for the same model.

The served name is the model's name as the store lists it (`kvdeck models`: the folder's
name in kvdeck's store, a hub id, the name a folder was added as, "kvdeck-demo"), or for a
folder the store does not list, the folder's name; `--served-model-name` overrides it. A
request may also name the model as `--model` gave it, or by its full path: a client that
copied either from the command line still reaches it.
"""

from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store.local_models import find_model


@dataclass(frozen=True, slots=True)
class ServedNames:
    name: str  # what /v1/models lists and responses carry
    aliases: frozenset[str]  # other names requests may give (never containing `name`)

    def __contains__(self, model: object) -> bool:
        return model == self.name or model in self.aliases


def served_names(model: str, *, override: str | None = None,
                 aliases: tuple[str, ...] = ()) -> ServedNames:
    """The names for `model` (a directory, a hub id or a store name, as the engine was given
    it); `aliases`: more names to accept (the `--model` the user typed before it was resolved)."""
    listed = find_model(model)
    folder = listed.path if listed is not None else _folder(model)
    default = listed.name if listed is not None else folder.name if folder is not None else model
    name = override or default
    accepted = {model, default, *aliases}
    if folder is not None:
        accepted.add(str(folder.resolve()))
    return ServedNames(name, frozenset(accepted - {name, ""}))


def _folder(model: str) -> Path | None:
    path = Path(model).expanduser()
    return path if path.is_dir() else None
