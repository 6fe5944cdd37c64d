"""Where kvdeck keeps things on disk, and where the Hugging Face hub's cache is.

Everything is read from the environment at call time (not at import), so a test or a
user who sets HF_HOME / HF_HUB_CACHE / HF_ENDPOINT / KVDECK_HOME after start-up is obeyed.
huggingface_hub's own `constants` are frozen when it is imported, so we do not use them
for anything the user may change.
"""

import os
from pathlib import Path

import platformdirs

APP_NAME = "kvdeck"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"


def data_dir() -> Path:
    """kvdeck's data directory (transcripts, logs, the model store). KVDECK_HOME overrides."""
    override = os.environ.get("KVDECK_HOME")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    """kvdeck's settings (the TUI's chat settings). KVDECK_HOME overrides, as for data."""
    override = os.environ.get("KVDECK_HOME")
    if override:
        return Path(override).expanduser() / "config"
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Scratch that may be deleted at any time (staging of quantise jobs lives in the store)."""
    override = os.environ.get("KVDECK_HOME")
    if override:
        return Path(override).expanduser() / "cache"
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def store_dir() -> Path:
    """kvdeck's own model store: quantised models and anything not in the HF cache."""
    return data_dir() / "models"


def staging_dir() -> Path:
    """Work in progress (quantise jobs). Same filesystem as the store, so finishing is a rename."""
    return store_dir() / ".staging"


def registry_path() -> Path:
    """The JSON file that lists verified models and downloads in progress."""
    return data_dir() / "registry.json"


def hf_home() -> Path:
    """HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface (huggingface_hub's rule)."""
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface"


def hf_hub_cache() -> Path:
    """The hub cache: HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    return hf_home() / "hub"


def hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")


def hf_token() -> str | None:
    """HF_TOKEN (or the legacy HUGGING_FACE_HUB_TOKEN), else the token file `hf auth login` wrote."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip() or None
    token_path = os.environ.get("HF_TOKEN_PATH")
    path = Path(token_path).expanduser() if token_path else hf_home() / "token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def hf_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return value in ("1", "on", "yes", "true")


def repo_cache_folder(repo_id: str) -> Path:
    """`models--org--name` in the hub cache (huggingface_hub's layout)."""
    return hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))
