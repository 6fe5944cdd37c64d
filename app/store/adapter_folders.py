"""LoRA adapter folders beside the local models: a folder holding PEFT's adapter_config.json
in kvdeck's store, or beside (or inside) a model folder the user added, or an adapter folder
the user added itself (kept in the registry, as added model folders are). The Models screen
lists them with their rank and the model they were trained on, and the chat offers the ones
that fit the loaded model.

Read with the engine's own checks (engine/types/lora.py, no torch), so a folder the engine
would refuse is listed with the reason instead.
"""

from dataclasses import dataclass
from pathlib import Path

from kvdeck.app.store import paths, registry
from kvdeck.app.store.local_models import LocalModel
from kvdeck.engine.types.lora import ADAPTER_CONFIG, read_adapter_info

MAX_DEPTH = 2  # store/org/name: how deep under a root a folder is looked for
MAX_FOLDERS = 2000  # folders looked at in all, so a huge root never stalls the screen
ADDED_KEY = "adapter_folders"  # the registry's record of added adapter folders: path -> name


@dataclass(frozen=True, slots=True)
class AdapterFolder:
    name: str  # the folder's name
    path: Path
    rank: int | None  # None: unreadable (see problem)
    target_modules: tuple[str, ...]
    base: str | None  # adapter_config's base_model_name_or_path, as written
    base_model: str | None  # the listed model it names (None: none of them)
    problem: str | None = None  # why the engine would refuse it

    @property
    def usable(self) -> bool:
        return self.problem is None


def find_adapters(models: list[LocalModel], roots: list[Path] | None = None) -> list[AdapterFolder]:
    """The adapter folders under kvdeck's store and beside or inside the listed models'
    folders (or under `roots`), by name."""
    if roots is None:
        roots = [paths.store_dir(), *(m.path.parent for m in models if m.source == "folder"),
                 *(m.path for m in models if m.source in ("folder", "store"))]
    seen: set[Path] = set()
    found: list[AdapterFolder] = []
    budget = [MAX_FOLDERS]
    added = [Path(p) for p in registry.read().get(ADDED_KEY, {})]
    for root in [None, *roots]:
        folders = added if root is None else _adapter_dirs(Path(root), MAX_DEPTH, budget)
        for folder in folders:
            resolved = folder.resolve()
            if resolved not in seen:
                seen.add(resolved)
                found.append(describe_adapter(folder, models))
    return sorted(found, key=lambda a: (a.name.lower(), str(a.path)))


def add_adapter_folder(path: str | Path, models: list[LocalModel]) -> AdapterFolder:
    """List an adapter folder from elsewhere on disk (nothing is copied); ValueError naming
    the problem if it is not one the engine would serve."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"{path}: no such folder")
    folder = folder.resolve()
    try:
        read_adapter_info(folder)
    except OSError as exc:
        raise ValueError(f"cannot read {folder}: {exc.strerror or exc}") from None

    def change(data: dict) -> None:
        data.setdefault(ADDED_KEY, {})[str(folder)] = folder.name

    registry.update(change)
    return describe_adapter(folder, models)


def describe_adapter(folder: Path, models: list[LocalModel]) -> AdapterFolder:
    try:
        info = read_adapter_info(folder)
    except (ValueError, OSError) as exc:  # OSError: a folder we may not read
        return AdapterFolder(folder.name, folder, None, (), None, None, str(exc))
    base = info.base_model_name_or_path
    return AdapterFolder(folder.name, folder, info.rank, info.target_modules, base,
                         base_model_name(base, models))


def base_model_name(base: str | None, models: list[LocalModel]) -> str | None:
    """The listed model an adapter's base_model_name_or_path names: its hub id or store
    name, its folder, or its folder's name."""
    if not base:
        return None
    for model in models:
        if base in (model.name, str(model.path), model.path.name):
            return model.name
        try:
            if Path(base).expanduser().resolve() == model.path.resolve():
                return model.name
        except OSError:
            continue
    return None


def _adapter_dirs(root: Path, depth: int, budget: list[int]) -> list[Path]:
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    found = []
    for child in children:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        if (child / ADAPTER_CONFIG).is_file():
            found.append(child)
        elif depth > 1 and not (child / "config.json").is_file():  # not inside models' folders
            found += _adapter_dirs(child, depth - 1, budget)
    return found
